"""Knobs changed while a real run goes (the first thing the product promises): the sync interval raised and
lowered, the staleness threshold changed, generation paused and resumed — each run finishes with exit 0 and
an exact ledger, the syncs follow the interval in force, and a resume keeps a value changed live."""

from __future__ import annotations

import threading
import time

import pytest
import ray
from reliability_helpers import assert_ledger_exact, events, read_jsonl, tiny_config, train_steps

from engine.runtime.driver import run
from engine.plan.run_plan import resolve_plan

pytestmark = pytest.mark.integration

STEPS = 48
EXTRA = (f"rollout.total_rollout_steps={8 * STEPS}", "async_training.trigger_parameter_sync_step=1")


def _operator(run_dir, name: str, plan: list[tuple[int, str, object]], done: list) -> None:
    """Like `asyncrl ctl RUN set KNOB VALUE` at the given trainer steps (a negative step: right away)."""
    deadline = time.monotonic() + 300
    controller = None
    for at_step, knob, value in plan:
        while time.monotonic() < deadline and len(train_steps(run_dir)) < at_step:
            time.sleep(0.02)
        while controller is None and time.monotonic() < deadline:
            try:
                # the driver's namespace, asyncrl.<run id>: this thread shares its process
                controller = ray.get_actor(name, namespace=ray.get_runtime_context().namespace)
            except (ValueError, RuntimeError, AssertionError):  # Ray or the controller not up yet
                time.sleep(0.05)
        if knob == "stop":
            ray.get(controller.request_action.remote("stop", "tester@test"))
        else:
            assert ray.get(controller.set_knob.remote(knob, value, None, "tester@test"))["ok"]
            while knob == "paused" and time.monotonic() < deadline and not any(
                    e.get("new") == value for e in _applied(run_dir, knob)):
                time.sleep(0.05)  # an operator holds a pause until the dashboard shows it taken
        done.append((knob, value))


def _run_with(tmp_path, plan, *extra: str, resume: str | None = None):
    run_dir = tmp_path / "run"
    cfg = tiny_config(run_dir, *EXTRA, *extra)
    done: list = []
    t = threading.Thread(target=_operator, args=(run_dir, cfg.name, plan, done), daemon=True)
    t.start()
    rc = run(resolve_plan(cfg), progress=False, resume=resume)
    t.join(timeout=10)
    return cfg, run_dir, rc, done


def _applied(run_dir, knob: str) -> list[dict]:
    return [e for e in events(run_dir, "knob") if e.get("knob") == knob and e.get("phase") == "applied"]


def _sync_steps(run_dir) -> list[int]:
    """The local step of every weight sync, from events.jsonl."""
    return [e["step"] for e in events(run_dir, "sync") if "pushed" in e["message"]]


def test_raising_then_lowering_the_sync_interval_mid_run(tmp_path) -> None:
    cfg, run_dir, rc, done = _run_with(tmp_path, [(6, "trigger_parameter_sync_step", 4),
                                                  (24, "trigger_parameter_sync_step", 2)])
    assert rc == 0 and len(done) == 2
    raised, lowered = _applied(run_dir, "trigger_parameter_sync_step")
    a1, a2 = raised["applied_step"], lowered["applied_step"]
    assert (raised["new"], lowered["new"]) == (4, 2)
    syncs = _sync_steps(run_dir)
    assert [s for s in syncs if s <= a1] == list(range(1, a1 + 1))  # every step at trigger 1
    between = [s for s in syncs if a1 < s < a2]
    assert between and all(b - a == 4 for a, b in zip([a1, *between], between)), (a1, between)
    after = [s for s in syncs if s >= a2]  # a lowered interval already reached syncs at its own boundary
    assert after and all(b - a == 2 for a, b in zip(after, after[1:])), (a2, after)
    assert after[0] - max([a1, *between]) <= 4
    assert [s for s, _ in train_steps(run_dir)] == list(range(1, STEPS + 1))
    assert_ledger_exact(cfg, run_dir, trained=8 * STEPS)


def test_staleness_threshold_changes_and_pause_mid_run(tmp_path) -> None:
    plan = [(4, "staleness_threshold", 0.0), (10, "paused", True), (-1, "paused", False),
            (16, "staleness_threshold", 1.0)]
    cfg, run_dir, rc, done = _run_with(tmp_path, plan)
    assert rc == 0 and len(done) == 4
    to_zero, to_one = _applied(run_dir, "staleness_threshold")
    assert (to_zero["new"], to_one["new"]) == (0.0, 1.0)
    # the bound the trainer reports follows the value in force (⌈threshold⌉), from the step after it applied
    bound = {r["training/global_step"]: r["asyncrl/staleness/bound"]
             for r in read_jsonl(run_dir / "metrics.jsonl") if "asyncrl/staleness/bound" in r}
    assert {bound[s] for s in bound if s <= to_zero["applied_step"]} == {1.0}
    assert {bound[s] for s in bound if to_zero["applied_step"] + 2 <= s <= to_one["applied_step"]} == {0.0}
    assert {bound[s] for s in bound if s >= to_one["applied_step"] + 2} == {1.0}
    assert [e["new"] for e in _applied(run_dir, "paused")] == [True, False]
    assert [s for s, _ in train_steps(run_dir)] == list(range(1, STEPS + 1))
    assert_ledger_exact(cfg, run_dir, trained=8 * STEPS)


def test_resume_after_a_raise_keeps_the_new_interval(tmp_path) -> None:
    cfg, run_dir, rc, _ = _run_with(tmp_path, [(4, "trigger_parameter_sync_step", 4), (10, "stop", None)])
    assert rc == 0
    stopped_at = train_steps(run_dir)[-1][0]
    assert stopped_at < STEPS
    assert run(resolve_plan(cfg), resume="auto", progress=False) == 0
    resumed = [r for r in train_steps(run_dir) if r[0] > stopped_at]
    assert resumed, "the resumed run trained nothing"
    syncs = [s for s in _sync_steps(run_dir) if s > stopped_at]
    assert all(b - a == 4 for a, b in zip(syncs, syncs[1:])), syncs  # the live value survived the resume
    assert [s for s, _ in train_steps(run_dir)] == list(range(1, STEPS + 1))
    assert_ledger_exact(cfg, run_dir, trained=8 * STEPS)
