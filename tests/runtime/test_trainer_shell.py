"""The trainer's shell without Ray: `TrainerCore` (the real torch backend on the tiny model) driven by
`TrainerLoop`'s commands against its in-process peers (`engine.runtime.peers_local`): the real queue holding real
trajectory groups, the real `ControllerCore`, the real weight publish through an in-process object store, and a
rollouter stand-in that keeps what each sync delivered. What it does — steps, syncs, the checkpoint cut, knobs, the
stop, an injected fault — is the core's."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from engine.control.core import ControllerCore
from engine.loop.knobs import ROLLOUTER, KnobChange, KnobInbox
from engine.runtime.peers import ProcessExit
from engine.runtime.peers_local import LocalQueue, trainer_peers
from engine.types import Prompt, Trajectory, TrajectoryGroup

R, N = 4, 2  # prompts per step, answers per prompt


class Rollouter:
    """The rollouter as the trainer sees it (`engine.runtime.peers.RollouterPeer`'s calls, in process): it keeps a
    copy of the weights each sync (or a resume) delivered, and the groups the trainer released."""

    def __init__(self) -> None:
        self.syncs: list[tuple[int, bool]] = []
        self.released: list[tuple[list, str]] = []
        self.pushed: dict[int, dict] = {}  # version → a copy of the weights a sync (or a resume) gave the replicas

    def _keep(self, version: int, buckets: list) -> None:
        self.pushed[version] = {k: v.clone() for b in buckets for k, v in b.items()}

    def update_weights(self, version: int, refs: list, step: int, snapshot: bool = False, held: int = 0) -> dict:
        self.syncs.append((version, snapshot))
        self._keep(version, refs)
        out = {"asyncrl/sync/pause_s": 0.0, "asyncrl/sync/transfer_s": 0.0, "receipts": {}}
        if snapshot:
            out["snapshot"] = self.snapshot(False)
        return out

    def load_weights(self, version: int, refs: list) -> dict:
        self._keep(version, refs)
        return {}

    def trainer_phase(self, computing: bool, seq: int) -> int:
        import torch

        return torch.get_num_threads()

    def sync_generation(self) -> tuple[int, None]:
        return 0, None

    def catch_up_slots(self) -> list[int]:
        return []

    def replacements_starting(self) -> int:
        return 0

    def snapshot(self, drain: bool = True) -> dict:
        return {"rollout": {"staleness_threshold": 0.5}, "queued": [], "in_flight": []}

    def report(self, step: int | None = None) -> dict:
        return {}

    def allow(self, need: int) -> None: ...

    def release(self, uids: list, reason: str) -> None:
        self.released.append((list(uids), reason))

    def outstanding_min_version(self) -> None:
        return None

    def final_validation(self, version: int, step: int) -> None: ...

    def stop(self) -> dict:
        return {"in_flight": [], "dropped": []}


def _groups(k: int) -> list[TrajectoryGroup]:
    return [TrajectoryGroup(Prompt(f"0:{i}", i, 0, [1, 2, 3]),
                            [Trajectory([4 + j, 5], [-1.0, -1.0], "stop", 0, 0, reward=float(j)) for j in range(N)])
            for i in range(k)]


def _queue(groups: list[TrajectoryGroup]) -> LocalQueue:
    """The real queue holding `groups`, closed: the rollout side has put everything it will."""
    q = LocalQueue(max(1, len(groups)))
    for g in groups:
        assert q.put(g) is None
    q.close()
    return q


@pytest.fixture()
def shell(tmp_path: Path, tiny_roles):
    from engine.runtime.trainer_actor import TrainerCore

    def build(steps: int, *extra: str, groups: list[TrajectoryGroup] | None = None, resume: dict | None = None,
              core: ControllerCore | None = None):
        sets = [f"rollout.total_rollout_steps={R * steps}", "rollout.n=2", 'rollout.weight_sync="object_store"',
                "trainer.ppo_mini_batch_size=4", "trainer.ppo_micro_batch_size_per_gpu=8", "trainer.test_freq=0",
                "async_training.trigger_parameter_sync_step=1", "checkpoint.every_versions=2", *extra]
        cfg, roles = tiny_roles(*sets, resume=resume)
        core = core or ControllerCore(cfg.name, run_dir=str(tmp_path / "run"), sinks=[], config=cfg.model_dump())
        rollouter = Rollouter()
        peers = trainer_peers(_queue(_groups(R * steps) if groups is None else groups), rollouter, core)
        return TrainerCore(roles.trainer, peers), core, rollouter

    return build


def test_the_shell_trains_syncs_and_cuts_checkpoints_as_the_core_says(shell, tmp_path) -> None:
    t, core, rollouter = shell(3)
    core.set_knob("staleness_threshold", 2.0)
    core.ack_knob("staleness_threshold", 1, 0)  # the rollouter applied it
    out = t.fit()
    assert (out["local_step"], out["version"]) == (3, 3)
    assert rollouter.syncs == [(1, False), (2, True), (3, False)]
    records = [r for r in core.snapshot()["metrics"] if "training/global_step" in r]
    assert [r["training/global_step"] for r in records] == [1, 2, 3]
    assert {r["asyncrl/staleness/bound"] for r in records} == {2.0}  # the value in force, not the initial 0.5
    ckpts = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir() if p.name.startswith("global"))
    assert ckpts == ["global_step_2", "global_step_3"]  # periodic at v2, final at the end
    ledger = [json.loads(x) for x in (tmp_path / "run" / "ledger.jsonl").read_text().splitlines()]
    assert sum(e["status"] == "trained" for e in ledger) == 3 * R


@pytest.mark.parametrize("mode", ["trainer.deterministic=true", "algorithm.rollout_correction.bypass_mode=false"])
def test_a_stop_between_two_syncs_resumes_serving_the_versions_weights(shell, tmp_path, mode) -> None:
    """Issue 48's soak: a sync every 2 steps, a graceful stop after step 3 (one step past the sync of v1). The
    resumed trainer gives the replicas v1's weights — what that sync pushed — not its own step-3 weights, keeps
    them as its snapshot (π_prox in decoupled mode), and itself continues from step 3's weights."""
    import torch

    from engine.persist.checkpoint import latest_valid, read_checkpoint

    sets = ("async_training.trigger_parameter_sync_step=2", "debug.stop_at_step=3", mode)
    t, _, rollouter = shell(8, *sets)
    out = t.fit()
    assert (out["local_step"], out["version"], out["stopped"]) == (3, 1, "debug.stop_at_step=3")
    ckpt = read_checkpoint(latest_valid(tmp_path / "run" / "checkpoints"))
    assert (ckpt["state"]["reason"], ckpt["state"]["since_sync"], ckpt["state"]["version_weights"]) == ("stop", 1, True)

    resumed, _, replicas = shell(8, *sets, resume={"trainer_dir": ckpt["trainer_dir"], "state": ckpt["state"]})
    resumed.push_version()
    served, v1 = replicas.pushed[1], rollouter.pushed[1]
    assert served.keys() == v1.keys() and all(torch.equal(served[k], v1[k]) for k in v1)
    assert resumed.weights_sha256() == ckpt["state"]["weights_sha256"]  # the trainer's own: step 3's
    live = resumed.backend.full_state_dict()
    assert any(not torch.equal(served[k], live[k]) for k in served)  # step 3 moved past v1
    assert all(torch.equal(a, b) for a, b in zip(resumed.backend._snapshot, t.backend._snapshot))


def test_a_live_interval_and_a_stop_reach_the_actor_only_through_the_core(shell) -> None:
    t, core, rollouter = shell(6)
    core.set_knob("trigger_parameter_sync_step", 2)
    core.request_action("stop")
    out = t.fit()
    assert out["local_step"] == 0 and out["version"] == 0  # the stop is taken at the first boundary
    assert core.get_knobs()["trigger_parameter_sync_step"]["applied_value"] == 2
    # the rollouter is not called: it follows the applied interval through its inbox, as the trainer follows staleness
    assert KnobInbox(ROLLOUTER).take(core.get_knobs()) == [KnobChange("trigger_parameter_sync_step", 2, 1, False)]


def test_dynamic_sampling_drops_uniform_groups_releases_them_and_trains_full_steps(shell, tmp_path) -> None:
    """`algorithm.filter_groups`: every third group scored alike; the shell records them as dropped (reason
    `filtered`) and releases them to the rollouter; each step still trains R groups, all with reward variance."""
    mixed = _groups(2 * R)
    flat = [TrajectoryGroup(Prompt(f"0:{100 + i}", 100 + i, 0, [1, 2, 3]),
                            [Trajectory([4, 5], [-1.0, -1.0], "stop", 0, 0, reward=1.0) for _ in range(N)])
            for i in range(R)]
    stream = [g for pair in zip(mixed[:R], flat) for g in pair] + mixed[R:]
    t, core, rollouter = shell(2, "algorithm.filter_groups.enable=true", groups=stream)
    out = t.fit()
    assert out["local_step"] == 2
    assert [u for uids, _ in rollouter.released for u in uids] == [g.prompt.uid for g in flat]
    assert {why for _, why in rollouter.released} == {"filtered"}
    ledger = [json.loads(x) for x in (tmp_path / "run" / "ledger.jsonl").read_text().splitlines()]
    assert sorted(e["uid"] for e in ledger if e["status"] == "trained") == sorted(g.prompt.uid for g in mixed)
    assert {e["uid"]: e.get("reason") for e in ledger if e["status"] == "dropped"} == \
        {g.prompt.uid: "filtered" for g in flat}
    records = [r for r in core.snapshot()["metrics"] if "training/global_step" in r]
    assert records[-1]["asyncrl/count/filtered_groups"] == R
    assert all(r["asyncrl/zero_adv_fraction"] == 0.0 for r in records)


def test_dynamic_sampling_on_a_metric_the_reward_does_not_return_fails_naming_it(shell) -> None:
    """metric = "acc" with a reward function that returns only a score: the trainer stops at the first pull with
    a message naming the key and the fix, instead of training or filtering on a guess."""
    t, _, _ = shell(1, "algorithm.filter_groups.enable=true", 'algorithm.filter_groups.metric="acc"')
    with pytest.raises(ValueError, match=r"metric = 'acc', but the reward function returned no 'acc'.*score"):
        t.fit()


@pytest.fixture()
def small_disk(tmp_path: Path):
    """A real 24 MiB tmpfs for the checkpoints (root only); elsewhere the test is skipped, never faked."""
    import subprocess

    mnt = tmp_path / "disk"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("mounting a tmpfs needs root")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(disk: Path, leave: int) -> None:
    """A ballast file that leaves `leave` bytes free on `disk`."""
    import shutil

    free = shutil.disk_usage(disk).free
    with (disk / "ballast").open("wb") as f:
        f.write(b"\0" * max(0, free - leave))


def test_a_periodic_checkpoint_on_a_full_disk_is_an_error_and_the_run_goes_on(shell, small_disk) -> None:
    """The disk fills after the first periodic checkpoint: the second one fails (an error event, its partial
    directory gone, the first kept), space comes back, the run goes on and its last checkpoint is written."""
    from engine.persist.checkpoint import verify_checkpoint

    root = small_disk / "ckpt"
    t, core, _ = shell(3, "checkpoint.every_versions=1", f'checkpoint.dir="{root}"', "checkpoint.keep_last=3")
    record = core.record_event

    def on_event(ev: dict, *a, **k):
        if ev["kind"] == "checkpoint" and ev.get("level") == "info" and ev.get("path", "").endswith("_1"):
            _fill(small_disk, 1 << 20)  # the disk is full after the first checkpoint...
        if ev["kind"] == "checkpoint" and ev.get("level") == "error":
            (small_disk / "ballast").unlink()  # ...until the failed save has been reported
        return record(ev, *a, **k)

    core.record_event = on_event
    out = t.fit()
    assert (out["local_step"], out["version"]) == (3, 3)  # the run went on to its end
    events = [e for e in core.snapshot()["events"] if e["kind"] == "checkpoint"]
    (err,) = [e for e in events if e["level"] == "error"]
    assert err["no_space"] and "global_step_2" in err["message"] and err["kept"].endswith("global_step_1")
    assert sorted(p.name for p in root.iterdir()) == ["global_step_1", "global_step_3"]  # no partial directory
    assert verify_checkpoint(root / "global_step_1") is None and verify_checkpoint(root / "global_step_3") is None


def test_the_final_checkpoint_on_a_full_disk_fails_the_run(shell, small_disk) -> None:
    root = small_disk / "ckpt"
    t, core, _ = shell(2, "checkpoint.every_versions=0", f'checkpoint.dir="{root}"')
    _fill(small_disk, 1 << 20)
    with pytest.raises(RuntimeError, match="the final checkpoint failed: NoSpaceForCheckpoint: no space left"):
        t.fit()
    assert not [p for p in root.iterdir() if p.name.startswith(".tmp-")]


class StalledController(ControllerCore):
    """A controller whose process stalls in `ack_knob` (until `release`): its answer never comes in time."""

    def __init__(self, *a, **k) -> None:
        super().__init__(*a, **k)
        self.stall = threading.Event()

    def ack_knob(self, name: str, version: int, step: int | None) -> dict:
        self.stall.wait(60)
        return super().ack_knob(name, version, step)


def test_a_controller_that_never_acknowledges_a_knob_fails_the_run_with_one_line(shell, tiny_roles, tmp_path) -> None:
    """The knob acknowledgement waits `CONTROLLER_ANSWER_S` at most (here shortened on the shell to 1 s); then the run
    fails naming the knob, with an error event, instead of hanging at the step boundary."""
    from engine.runtime.trainer_actor import CONTROLLER_ANSWER_S, TrainerCore

    cfg, _ = tiny_roles()
    core = StalledController(cfg.name, run_dir=str(tmp_path / "run"), sinks=[], config=cfg.model_dump())
    t, _, _ = shell(3, core=core)
    assert TrainerCore.controller_answer_s == CONTROLLER_ANSWER_S == 60.0  # the run's deadline
    t.controller_answer_s = 1.0
    core.set_knob("trigger_parameter_sync_step", 2)  # the trainer acknowledges it at its first boundary
    start = time.monotonic()
    try:
        with pytest.raises(RuntimeError, match=r"did not acknowledge the change of trigger_parameter_sync_step "
                                                r"\(knob version 1\) within 1 s"):
            t.fit()
    finally:
        core.stall.set()
    assert 1.0 <= time.monotonic() - start < 30.0  # waited out its deadline, not for ever
    errors = [e["message"] for e in core.snapshot()["events"] if e["level"] == "error"]
    assert any("controller did not acknowledge" in m for m in errors), errors


class UnansweringController(ControllerCore):
    """A controller whose process stalls when asked for its knobs (until `release`)."""

    def __init__(self, *a, **k) -> None:
        super().__init__(*a, **k)
        self.stall = threading.Event()

    def get_knobs(self) -> dict:
        self.stall.wait(60)
        return super().get_knobs()


def test_a_controller_that_does_not_answer_the_knob_poll_fails_the_run_with_one_line(shell, tiny_roles,
                                                                                    tmp_path) -> None:
    """At each step boundary the trainer reads the knobs and its actions from the run's controller, waiting
    `CONTROLLER_ANSWER_S` at most (shortened here to 1 s): a stalled controller fails the run in one line."""
    cfg, _ = tiny_roles()
    core = UnansweringController(cfg.name, run_dir=str(tmp_path / "run"), sinks=[], config=cfg.model_dump())
    t, _, _ = shell(3, core=core)
    t.controller_answer_s = 1.0
    start = time.monotonic()
    try:
        with pytest.raises(RuntimeError, match=r"did not answer the step boundary's knob poll within 1 s"):
            t.fit()
    finally:
        core.stall.set()
    assert 1.0 <= time.monotonic() - start < 30.0


def test_a_trainer_killed_at_a_step_exits_after_its_update_before_the_ledger(shell, tmp_path) -> None:
    """`debug.kill_trainer_at_step=2`: the fault plan's `ExitProcess(17)` reaches the process peer in step 2, after
    its optimizer update (the weights moved) and before the step is recorded: the ledger holds step 1's prompts as
    trained and none of step 2's, and no checkpoint was cut (a process that dies cuts none)."""
    import torch

    t, core, rollouter = shell(4, "debug.kill_trainer_at_step=2", "checkpoint.every_versions=0")
    with pytest.raises(ProcessExit) as died:
        t.fit()
    assert (died.value.code, died.value.reason) == (17, "debug.kill_trainer_at_step=2")
    assert t.peers.process.exits == [(17, "debug.kill_trainer_at_step=2")]
    assert t.local_step == 1 and rollouter.syncs == [(1, False)]  # step 2 never finished, so never synced
    v1, live = rollouter.pushed[1], t.backend.full_state_dict()
    assert any(not torch.equal(v1[k], live[k]) for k in v1)  # step 2's update moved the weights past v1
    ledger = [json.loads(x) for x in (tmp_path / "run" / "ledger.jsonl").read_text().splitlines()]
    assert sorted(e["uid"] for e in ledger if e["status"] == "trained") == [f"0:{i}" for i in range(R)]
    assert not (tmp_path / "run" / "checkpoints").exists() or \
        not [p for p in (tmp_path / "run" / "checkpoints").iterdir() if p.name.startswith("global")]


def test_every_event_a_shell_or_the_driver_records_is_built_by_one_function() -> None:
    """Events are built in one place (`engine.telemetry.events.run_event`): no runtime module writes an event dict
    of its own, so the record's fields cannot drift between the driver, the trainer and the rollouter."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "engine" / "runtime"
    own = [f"{p.name}:{i}" for p in sorted(root.glob("*.py")) for i, line in enumerate(p.read_text().splitlines(), 1)
           if re.search(r"""["']message["']\s*:""", line)]
    assert own == [], own
