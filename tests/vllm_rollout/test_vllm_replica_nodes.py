"""A vLLM rollout replica over two nodes of a Ray cluster on this machine (`ray.cluster_utils.Cluster`): whole runs
through `engine.runtime.driver.run` with `rollout.tensor_parallel_size = 2` over `resources.rollout` of 2 nodes × 1
worker, so the one replica is one vLLM engine whose two TP workers run on the two nodes (vLLM's multi-node executor,
`engine.runtime.replica_nodes`). The runs must generate, verify every sync on every worker of the replica (by each
worker's own fingerprints: the first run syncs by the collective broadcast, which each worker receives itself, the
second through the object store, whose bytes vLLM's RPC carries to the other node), and keep the ledger exact — also
when the replica's worker on the other node is SIGKILLed mid-run. About 4 min each on 2 shared cores."""

from __future__ import annotations

import importlib.util
import os
import signal
import threading
import time
from pathlib import Path
from types import ModuleType

import pytest
from vllm_tiny_model import have_vllm, integration_run_helpers

if not have_vllm():
    pytest.skip("vllm is not installed (run `make test-vllm`)", allow_module_level=True)

pytestmark = [pytest.mark.vllm, pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]

STEPS = 4
PROMPTS_PER_STEP = 8
SPANNING = (
    'rollout.backend="vllm"',
    "rollout.tensor_parallel_size=2",
    "resources.rollout.nnodes=2",
    "resources.rollout.gpus_per_node=1",
    f"trainer.ppo_mini_batch_size={PROMPTS_PER_STEP}",
    "trainer.ppo_micro_batch_size_per_gpu=16",
    "rollout.n=4",
    "trainer.test_freq=0",
    "async_training.trigger_parameter_sync_step=2",
    'trainer.backend="torch"',
    "resources.placement_timeout_s=120",
)


def _load(name: str, *parts: str) -> ModuleType:
    path = Path(__file__).resolve().parents[1].joinpath(*parts)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


H = integration_run_helpers()
R = _load("reliability_helpers_for_vllm", "reliability", "reliability_helpers.py")


@pytest.fixture
def cluster():
    """Two Ray nodes on this machine, this process connected to them (the run joins the connected cluster)."""
    import ray
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    node = {"num_cpus": 4, "object_store_memory": 300 * 2**20}
    c = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
    c.add_node(**node)
    c.wait_for_nodes()
    ray.init(address=c.address, logging_level="ERROR", log_to_driver=False)
    try:
        yield c
    finally:
        ray.shutdown()
        c.shutdown()


def _raylets(c) -> dict[int, str]:
    """raylet pid → its node id, for every node of the cluster."""
    return {n.all_processes["raylet"][0].process.pid: n.node_id for n in c.list_all_nodes()}


def _ppid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _vllm_workers(raylets: dict[int, str]) -> dict[int, str]:
    """The vLLM worker processes of this cluster (`VLLM::Worker…`, descendants of one of its raylets): pid → node."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if not stat.read_bytes().startswith(b"VLLM::Worker"):
                continue
            pid = p = int(stat.parent.name)
            while p > 1 and p not in raylets:
                p = _ppid(p)
        except (OSError, ValueError):
            continue
        if p in raylets:
            found[pid] = raylets[p]
    return found


class Watcher(threading.Thread):
    """Records where the replica's vLLM workers run while the run goes on; with `kill_after_syncs`, SIGKILLs the
    replica's worker on the node where its engine is not (node rank 1's) once that many syncs were reported."""

    def __init__(self, c, run_dir: Path, kill_after_syncs: int | None = None) -> None:
        super().__init__(daemon=True)
        self.raylets, self.run_dir, self.kill_after = _raylets(c), run_dir, kill_after_syncs
        self.seen: dict[int, str] = {}
        self.killed: int | None = None
        self.before: dict[int, str] = {}  # the workers seen until the kill (pid → node)
        self.stop = threading.Event()

    def syncs(self) -> int:
        events = self.run_dir / "events.jsonl"
        return sum(e["kind"] == "sync" for e in H.read_jsonl(events)) if events.exists() else 0

    def run(self) -> None:
        while not self.stop.wait(0.5):
            workers = _vllm_workers(self.raylets)
            self.seen.update(workers)
            if self.kill_after is None or self.killed is not None or self.syncs() < self.kill_after:
                continue
            engine_nodes = {self.raylets[p] for p in self._engine_raylets()}
            remote = [pid for pid, node in workers.items() if node not in engine_nodes]
            if remote:
                os.kill(remote[0], signal.SIGKILL)
                self.killed, self.before = remote[0], dict(self.seen)

    def _engine_raylets(self) -> list[int]:
        out = []
        for stat in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                if stat.read_bytes().startswith(b"VLLM::EngineCore"):
                    p = int(stat.parent.name)
                    while p > 1 and p not in self.raylets:
                        p = _ppid(p)
                    if p in self.raylets:
                        out.append(p)
            except (OSError, ValueError):
                continue
        return out


def _run(cfg) -> int:
    from engine.plan.run_plan import resolve_plan
    from engine.runtime.driver import run

    return run(resolve_plan(cfg), progress=False)


def _run_watched(cfg, watcher: Watcher) -> int:
    """The run, with `watcher` looking at (and maybe killing) the replica's workers while it goes."""
    watcher.start()
    try:
        return _run(cfg)
    finally:
        watcher.stop.set()
        watcher.join()


def _syncs(run_dir: Path) -> list[dict]:
    return [e for e in H.read_jsonl(run_dir / "events.jsonl") if e["kind"] == "sync" and "catch_up" not in e]


def test_a_replica_over_two_nodes_generates_and_every_worker_verifies_each_sync(cluster, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    cfg = H.tiny_config(run_dir, *SPANNING, f"rollout.total_rollout_steps={STEPS * PROMPTS_PER_STEP}")
    watcher = Watcher(cluster, run_dir)
    assert _run_watched(cfg, watcher) == 0
    # the replica's two TP workers ran on the two nodes
    assert len(watcher.seen) == 2 and len(set(watcher.seen.values())) == 2, watcher.seen
    recs = H.train_records(run_dir)
    assert [r["training/global_step"] for r in recs] == list(range(1, STEPS + 1))
    assert all(r["response_length/mean"] > 0 for r in recs)  # vLLM generated
    syncs = _syncs(run_dir)
    assert len(syncs) == STEPS // 2
    # "auto" on vLLM replicas: the collective broadcast, received by each worker on each node itself
    assert {e["transport"] for e in syncs} == {"CollectiveSync"}
    # verified on the replica and on each of its two workers (their own fingerprints of what they received)
    assert all(e["verified"] == 1.0 and e["replicas_verified"] == 1 and e["workers_verified"] == 2 for e in syncs)
    assert not [e for e in H.read_jsonl(run_dir / "events.jsonl") if e["kind"] == "sync" and e["level"] == "error"]
    R.assert_ledger_exact(cfg, run_dir, trained=STEPS * PROMPTS_PER_STEP)


def test_a_worker_killed_on_the_other_node_replaces_the_replica_and_the_ledger_stays_exact(cluster,
                                                                                         tmp_path: Path) -> None:
    steps = 6
    run_dir = tmp_path / "run"
    cfg = H.tiny_config(run_dir, *SPANNING, f"rollout.total_rollout_steps={steps * PROMPTS_PER_STEP}",
                        'rollout.weight_sync="object_store"')
    watcher = Watcher(cluster, run_dir, kill_after_syncs=1)
    assert _run_watched(cfg, watcher) == 0
    assert watcher.killed is not None, "no worker on the engine's other node was found to kill"
    assert len(set(watcher.before.values())) == 2, watcher.before
    # the replacement replica spans the two nodes again: new workers, on both
    later = {pid: node for pid, node in watcher.seen.items() if pid not in watcher.before}
    assert len(set(later.values())) == 2, (watcher.before, watcher.seen)
    replica = R.events(run_dir, "replica")
    assert [e["phase"] for e in replica] == ["restart", "replaced"], replica
    assert replica[0]["replica"] == 0 and "died" in replica[0]["message"]
    assert [s for s, _ in R.train_steps(run_dir)] == list(range(1, steps + 1))
    # every sync a replica received was verified on both of its workers; a sync while the replacement was starting
    # had no live replica (it loads the newest weights when up), and the last one reached the replacement
    syncs = _syncs(run_dir)
    assert len(syncs) == steps // 2 and syncs[0]["replicas_verified"] == syncs[-1]["replicas_verified"] == 1, syncs
    assert {e["transport"] for e in syncs} == {"ObjectStoreSync"}  # the bytes reach node rank 1 in vLLM's RPC
    assert all(e["verified"] == 1.0 and e["workers_verified"] == 2 for e in syncs if e["replicas_verified"]), syncs
    R.assert_ledger_exact(cfg, run_dir, trained=steps * PROMPTS_PER_STEP)
    time.sleep(2)
    alive = [pid for pid in watcher.seen if Path(f"/proc/{pid}").exists()
             and Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"]
    assert not alive, f"vLLM workers outlived the run: {alive}"
