"""The rollouter's Ray actor as an executor only, without Ray: `RolloutShell` (built from its `RolloutSpec`, with the
real tokenizer and reward scorer of the tiny model) driven by `RolloutLoop`'s commands against in-process
stand-ins of the queue and the replicas and the real `ControllerCore`. What it admits, when it stops, what each
group carries — the prompts an epoch needs, the budget per version, the weights that produced each answer — is
the core's and the spec's."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import ray

from engine.control.core import ControllerCore
from engine.plan.roles import RunIdentity
from engine.plan.run_plan import resolve_plan
from engine.types import GenResult

TINY = Path(__file__).resolve().parents[2] / "presets" / "runs" / "tiny-cpu.toml"
PER_VERSION = 2  # prompts one version may start: required_samples 2 × (1 + staleness 0) × trigger 1


class _Ref:
    """What a fake actor call returns: hashable like a Ray ref, resolved by the patched `ray.get`."""

    def __init__(self, value: Any) -> None:
        self.value = value


def _get(x: Any, **_: Any) -> Any:
    if isinstance(x, list):
        return [_get(y) for y in x]
    return x.value if isinstance(x, _Ref) else x


class _Remote:
    """`obj.method.remote(...)` runs `obj.method(...)` at once and returns a `_Ref` of its result."""

    def __init__(self, target: Any) -> None:
        self._t = target

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self._t, name)
        return type("M", (), {"remote": staticmethod(lambda *a, **k: _Ref(fn(*a, **k)))})


class FakeQueue:
    def __init__(self) -> None:
        self.groups: list = []
        self.closed = False
        self.max_size = 0

    def set_max_size(self, n: int) -> None:
        self.max_size = n

    def put(self, group: Any) -> None:
        self.groups.append(group)

    def size(self) -> int:
        return len(self.groups)

    def close(self) -> None:
        self.closed = True

    def peek_all(self) -> list:
        return list(self.groups)

    def take(self) -> list:
        """What the trainer's pulls would take."""
        got, self.groups = self.groups, []
        return got


class FakeReplica:
    """Answers every request at once with two tokens and EOS, drawn by the weights it holds."""

    def __init__(self, eos: int) -> None:
        self.eos, self.version, self.loads = eos, 0, []

    def limits(self) -> dict[str, int]:
        return {"rows": 8, "calls": 1}

    def generate(self, requests: list, sampling: Any, kind: str = "train") -> list[GenResult]:
        return [GenResult(r.request_id, [5, 6, self.eos], [-0.5] * 3, "stop", self.version, self.version, 3)
                for r in requests]

    def abort(self, validation: bool = False) -> None: ...

    def resume(self) -> None: ...

    def update_weights(self, bucket_refs: list, version: int) -> dict:
        self.version = version
        self.loads.append(version)
        return {"fingerprints": [], "weights": 0, "seconds": 0.0}


@pytest.fixture()
def shell(tmp_path: Path, monkeypatch):
    from asyncrl_cli.config import load_run_config
    from engine.models.loader import load_tokenizer, resolve_model_path
    from engine.runtime.rollouter import RolloutShell

    monkeypatch.setattr(ray, "get", _get)
    monkeypatch.setattr(ray, "wait", lambda refs, num_returns=1, timeout=None: (list(refs), []))
    cfg = load_run_config(TINY, [f'logging.run_dir="{tmp_path / "run"}"', "rollout.total_rollout_steps=8",
                                 "rollout.n=2", "trainer.ppo_mini_batch_size=2",
                                 "trainer.ppo_micro_batch_size_per_gpu=4", "trainer.test_freq=0",
                                 "trainer.val_before_train=false", "async_training.staleness_threshold=0",
                                 "async_training.trigger_parameter_sync_step=1"]).config
    model = str(resolve_model_path(cfg.model.path, seed=cfg.trainer.seed))
    spec = resolve_plan(cfg).role_specs().bind(RunIdentity("test", cfg.name, str(tmp_path / "run"), model)).rollout
    queue, replica = FakeQueue(), FakeReplica(load_tokenizer(model).eos_token_id)
    controller = ControllerCore(cfg.name, run_dir=str(tmp_path / "run"), sinks=[], config=cfg.model_dump())
    s = RolloutShell(spec, _Remote(queue), _Remote(controller), [_Remote(replica)])
    thread = threading.Thread(target=s.run, daemon=True)
    thread.start()
    yield s, queue, replica
    s.stop()
    thread.join(timeout=10)


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
            assert not queue.closed
            out = s.update_weights(version + 1, [], step=version + 1)
            assert out["receipts"] == {0: {"fingerprints": [], "weights": 0, "seconds": 0.0}}
    _wait(lambda: queue.closed)  # the stream's 8 prompts are out: the core closes the queue
    assert replica.loads == [1, 2, 3]
    assert [g.min_version for g in trained] == [0, 0, 1, 1, 2, 2, 3, 3]  # each answer from the weights it says
    assert len({g.prompt.uid for g in trained}) == 8
    for g in trained:
        assert len(g.trajectories) == 2 and all(t.reward is not None for t in g.trajectories)


def test_a_live_pause_stops_admission_until_it_is_lifted(shell) -> None:
    s, queue, _ = shell
    _wait(lambda: len(queue.groups) == PER_VERSION)
    queue.take()
    s.controller._t.set_knob("paused", True)
    time.sleep(1.2)  # knobs are polled twice a second
    s.update_weights(1, [], step=1)
    time.sleep(0.5)
    assert queue.groups == []  # paused: the sync's new budget is not used
    s.controller._t.set_knob("paused", False)
    _wait(lambda: len(queue.groups) == PER_VERSION)
    assert s.controller._t.get_knobs()["paused"]["applied_value"] is False


def test_groups_the_trainer_holds_at_a_sync_carry_over(shell) -> None:
    """`Sync.held` reaches the core through the shell: groups pulled but not trained at the sync use the new
    version's budget as queued ones do, so no more prompts start than the budget allows."""
    s, queue, _ = shell
    _wait(lambda: len(queue.groups) == PER_VERSION)
    queue.take()  # pulled; the trainer still holds them (a lowered interval's sync before their step)
    s.update_weights(1, [], step=0, held=PER_VERSION)
    time.sleep(0.5)
    assert queue.groups == [] and s.loop.budget.staleness_samples == PER_VERSION
