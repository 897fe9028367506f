"""Placement groups across nodes (`engine.runtime.placement_groups` over `engine.plan.layout`), on a
multi-node Ray cluster on this machine (`ray.cluster_utils.Cluster`: each node declares 4 GPUs; the actors only
report where they landed). The shape is seed 000's scaled down: 1 trainer node (4 ranks, Megatron TP 2) and 3
rollout nodes (6 replicas of TP 2)."""

from __future__ import annotations

import os
import time

import pytest
import ray

from engine.plan.layout import run_layout
from engine.runtime.placement_groups import PlacementTimeout, reserve

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]

GPUS = 4


@ray.remote(num_cpus=0)
def gpu_worker() -> tuple[str, str]:
    """A vLLM-style TP worker started from inside a replica (captured by the replica's placement group)."""
    return ray.get_runtime_context().get_node_id(), os.environ.get("CUDA_VISIBLE_DEVICES", "")


@ray.remote
class Probe:
    def where(self) -> dict:
        return {"node": ray.get_runtime_context().get_node_id(), "gpus": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
                "bundles": os.environ.get("VLLM_RAY_BUNDLE_INDICES")}

    def start_workers(self, bundles: list[int]) -> list[tuple[str, str]]:
        pg = ray.util.get_current_placement_group()
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return ray.get([gpu_worker.options(num_gpus=1, scheduling_strategy=PlacementGroupSchedulingStrategy(
            pg, placement_group_bundle_index=b)).remote() for b in bundles])


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": GPUS, "num_gpus": GPUS,
                                                      "include_dashboard": False})
    for _ in range(3):
        c.add_node(num_cpus=GPUS, num_gpus=GPUS)
    c.wait_for_nodes()
    yield c
    ray.shutdown()
    c.shutdown()


@pytest.fixture
def on_cluster(cluster):
    """Connected to the module's cluster (the directory's autouse fixture disconnects before every test)."""
    here = os.path.dirname(__file__)  # the workers import this module's actor class
    ray.init(address=cluster.address, logging_level="ERROR",
             runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join([here, os.environ.get("PYTHONPATH", "")])}})
    yield cluster


def test_seed000_shape_scaled_down_lands_node_by_node(on_cluster) -> None:
    layouts = run_layout(1, GPUS, 2, 3, GPUS, 6, 2)
    pools = reserve("cuda", layouts, timeout_s=60, run_name="test")
    try:
        ranks = [Probe.options(**o).remote() for o in pools.all_options("trainer", {"num_gpus": 1, "num_cpus": 1})]
        replicas = [Probe.options(**o).remote() for o in pools.all_options("rollout", {"num_gpus": 2, "num_cpus": 1})]
        t = ray.get([r.where.remote() for r in ranks])
        r = ray.get([p.where.remote() for p in replicas])
        # the trainer: one node, each rank its own GPU
        assert len({x["node"] for x in t}) == 1
        assert sorted(x["gpus"] for x in t) == ["0", "1", "2", "3"]
        trainer_node = t[0]["node"]
        # the rollout: replicas 2k and 2k+1 share a node, the three rollout nodes are distinct and not the trainer's
        nodes = [x["node"] for x in r]
        assert nodes[0::2] == nodes[1::2]
        assert len(set(nodes)) == 3 and trainer_node not in nodes
        assert [x["bundles"] for x in r] == ["0,1", "2,3"] * 3  # each replica's TP 2 bundles
        assert all(x["gpus"] == "" for x in r)  # a TP > 1 replica holds no GPU itself: its workers do
        # its TP workers land on the replica's own node, one GPU each
        workers = ray.get(replicas[3].start_workers.remote([2, 3]))
        assert {w[0] for w in workers} == {nodes[3]} and len({w[1] for w in workers}) == 2
        for a in ranks + replicas:
            ray.kill(a)
    finally:
        pools.release()


def test_a_pool_the_cluster_cannot_hold_fails_in_one_line(on_cluster) -> None:
    layouts = run_layout(1, GPUS, 1, 4, GPUS, 4 * GPUS, 1)  # 5 full nodes asked of a 4-node cluster
    start = time.monotonic()
    with pytest.raises(PlacementTimeout) as e:
        reserve("cuda", layouts, timeout_s=3, run_name="test-too-big")
    assert time.monotonic() - start < 30
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("could not place the ") and "node" in msg and "within 3 s" in msg
    assert ray.util.placement_group_table() and all(  # nothing left reserved
        v["state"] == "REMOVED" for v in ray.util.placement_group_table().values() if v["name"].startswith("test-too"))


def test_the_driver_reserves_what_dry_run_shows(on_cluster, tmp_path) -> None:
    """`driver._placement` + `placement_groups.reserve_run` (what the driver calls) for a CUDA preset: the options it hands the replicas and trainer
    ranks place them on the bundles `engine.plan.layout` (the dry-run's formula) names."""
    from run_helpers import tiny_config

    from engine.runtime import driver

    cfg = tiny_config(tmp_path / "run", 'resources.hardware="h100"', "resources.trainer.gpus_per_node=4",
                      "resources.rollout.nnodes=3", "resources.rollout.gpus_per_node=4")
    from engine.plan.run_plan import resolve_plan

    placement = driver._placement(resolve_plan(cfg))
    assert placement["replicas"] == 12 and placement["trainer_ranks"] == 4
    from engine.runtime.placement_groups import reserve_run

    pools = reserve_run(placement, "test-driver")
    try:
        ranks = [Probe.options(**o).remote() for o in placement["trainer_options"]]
        replicas = [Probe.options(**o).remote() for o in placement["replica_options"]]
        t = ray.get([r.where.remote() for r in ranks])
        r = ray.get([p.where.remote() for p in replicas])
        assert len({x["node"] for x in t}) == 1 and sorted(x["gpus"] for x in t) == ["0", "1", "2", "3"]
        nodes = [x["node"] for x in r]
        assert [nodes[i] == nodes[i - i % 4] for i in range(12)] == [True] * 12  # 4 TP-1 replicas per node
        assert len(set(nodes)) == 3 and t[0]["node"] not in nodes
        for a in ranks + replicas:
            ray.kill(a)
    finally:
        pools.release()
