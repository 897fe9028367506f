"""The rollouter's shell without Ray: `RolloutShell` (built from its `RolloutSpec`, with the real tokenizer and
reward scorer of the tiny model) driven by `RolloutLoop`'s commands against its in-process peers
(`engine.runtime.peers_local`): the real queue, the real `ControllerCore`, and a replica stand-in that answers at
once (behind the real `LocalReplica` peer). What it admits, when it stops, what each group carries — the prompts an
epoch needs, the budget per version, the weights that produced each answer — is the core's and the spec's; a
replica that dies surfaces as `PeerDied` and is replaced. (The real replica shell on the tiny model:
`test_loop_in_process.py`.)"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from engine.control.core import ControllerCore
from engine.runtime.peers_local import LocalQueue, rollout_peers
from engine.types import GenResult

PER_VERSION = 2  # prompts one version may start: required_samples 2 × (1 + staleness 0) × trigger 1


class InstantReplica:
    """Answers every request at once with two tokens and EOS, drawn by the weights it holds."""

    def __init__(self, eos: int) -> None:
        self.eos, self.version, self.loads = eos, 0, []

    def ready(self) -> int:
        return 0

    def limits(self) -> dict[str, int]:
        return {"rows": 8, "calls": 1}

    def generate(self, requests: list, sampling: Any, kind: str = "train") -> list[GenResult]:
        return [GenResult(r.request_id, [5, 6, self.eos], [-0.5] * 3, "stop", self.version, self.version, 3)
                for r in requests]

    def abort(self, validation: bool = False) -> None: ...

    def resume(self) -> None: ...

    def stages_weights(self) -> bool:
        return False

    def update_weights(self, bucket_refs: list, version: int) -> dict:
        self.version = version
        self.loads.append(version)
        return {"fingerprints": [], "weights": 0, "seconds": 0.0}


class Queue(LocalQueue):
    """The real queue; `take()` is what the trainer's pulls would take."""

    def take(self) -> list:
        return self.drain()

    @property
    def groups(self) -> list:
        return self.peek_all()


@pytest.fixture()
def start(tmp_path, tiny_roles):
    """`start(*sets, restarts=False)`: the rollout shell's dispatch loop running on a thread against its in-process
    peers; returns (shell, queue, replica stand-ins started so far). With `restarts`, a dead replica is replaced by a
    new stand-in."""
    from engine.models.loader import load_tokenizer
    from engine.runtime.rollouter import RolloutShell

    started: list[tuple[Any, threading.Thread]] = []

    def run(*sets: str, restarts: bool = False):
        cfg, roles = tiny_roles("rollout.total_rollout_steps=8", "rollout.n=2", "trainer.ppo_mini_batch_size=2",
                                "trainer.ppo_micro_batch_size_per_gpu=4", "trainer.test_freq=0",
                                "trainer.val_before_train=false", "async_training.staleness_threshold=0",
                                "async_training.trigger_parameter_sync_step=1", *sets)
        eos = load_tokenizer(roles.rollout.replica.model_dir).eos_token_id
        replicas = [InstantReplica(eos)]

        def spawn(rid: int) -> InstantReplica:
            replicas.append(InstantReplica(eos))
            return replicas[-1]

        queue = Queue(1)
        controller = ControllerCore(cfg.name, run_dir=str(tmp_path / "run"), sinks=[], config=cfg.model_dump())
        s = RolloutShell(roles.rollout, rollout_peers(queue, controller, list(replicas),
                                                      spawn if restarts else None))
        thread = threading.Thread(target=s.run, daemon=True)
        thread.start()
        started.append((s, thread))
        return s, queue, replicas

    yield run
    for s, thread in started:
        s.stop()
        thread.join(timeout=10)


@pytest.fixture()
def shell(start):
    s, queue, replicas = start()
    return s, queue, replicas[0]


def _wait(cond, timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


def test_the_shell_generates_scores_and_queues_what_the_core_admits(shell) -> None:
    s, queue, replica = shell
    assert s.loop.p.required_samples == 2 and s.loop.stream.total == 8  # the spec's sizes, nothing re-derived
    trained: list = []
    for version in range(4):
        _wait(lambda: len(queue.groups) == PER_VERSION)
        time.sleep(0.2)  # the budget holds: no prompt of the next version starts before its sync
        assert len(queue.groups) == PER_VERSION
        trained += queue.take()  # the trainer pulls them
        if version < 3:
            assert not queue.is_closed()
            out = s.update_weights(version + 1, [], step=version + 1)
            assert out["receipts"] == {0: {"fingerprints": [], "weights": 0, "seconds": 0.0}}
    _wait(queue.is_closed)  # the stream's 8 prompts are out: the core closes the queue
    assert replica.loads == [1, 2, 3]
    assert [g.min_version for g in trained] == [0, 0, 1, 1, 2, 2, 3, 3]  # each answer from the weights it says
    assert len({g.prompt.uid for g in trained}) == 8
    for g in trained:
        assert len(g.trajectories) == 2 and all(t.reward is not None for t in g.trajectories)


def test_a_live_pause_stops_admission_until_it_is_lifted(shell) -> None:
    s, queue, _ = shell
    _wait(lambda: len(queue.groups) == PER_VERSION)
    queue.take()
    s.controller.core.set_knob("paused", True)
    time.sleep(1.2)  # knobs are polled twice a second
    s.update_weights(1, [], step=1)
    time.sleep(0.5)
    assert queue.groups == []  # paused: the sync's new budget is not used
    s.controller.core.set_knob("paused", False)
    _wait(lambda: len(queue.groups) == PER_VERSION)
    assert s.controller.core.get_knobs()["paused"]["applied_value"] is False


def test_groups_the_trainer_holds_at_a_sync_carry_over(shell) -> None:
    """`Sync.held` reaches the core through the shell: groups pulled but not trained at the sync use the new
    version's budget as queued ones do, so no more prompts start than the budget allows."""
    s, queue, _ = shell
    _wait(lambda: len(queue.groups) == PER_VERSION)
    queue.take()  # pulled; the trainer still holds them (a lowered interval's sync before their step)
    s.update_weights(1, [], step=0, held=PER_VERSION)
    time.sleep(0.5)
    assert queue.groups == [] and s.loop.budget.staleness_samples == PER_VERSION


def test_a_replica_that_dies_is_reported_and_replaced_through_its_peer(start) -> None:
    """`debug.kill_replica_at_step=1`: at the trainer's report of step 1 the shell ends replica 0 through its peer
    (`debug_exit`); the next sync's weight load on it fails `PeerDied`, the loop re-queues its work, the pool starts
    a replacement (`rollout.max_replica_restarts`), and the next version's prompts are generated by the new one."""
    s, queue, replicas = start("debug.kill_replica_at_step=1", "rollout.max_replica_restarts=1", restarts=True)
    _wait(lambda: len(queue.groups) == PER_VERSION)
    queue.take()
    s.report(1)  # the fault: replica 0's process ends
    s.update_weights(1, [], step=1)
    _wait(lambda: len(queue.groups) == PER_VERSION)
    assert len(replicas) == 2 and replicas[1].loads == [1]  # the replacement, with the latest weights
    assert {g.min_version for g in queue.groups} == {1}
    events = [(e["kind"], e.get("phase"), e["message"]) for e in s.controller.core.snapshot()["events"]]
    assert any(k == "fault" for k, _, _ in events)
    (died,) = [m for k, ph, m in events if k == "replica" and ph == "restart"]
    assert died.startswith("rollout replica 0 died (its process died") and "restart 1/1" in died
    assert any(k == "replica" and ph == "replaced" for k, ph, _ in events)
