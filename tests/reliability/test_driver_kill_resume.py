"""(a) The driver is SIGKILLed after its first checkpoint; `--resume auto` continues at the same step and
version, and over the interruption every prompt is trained exactly once (none lost, none twice)."""

from __future__ import annotations

import os
import signal

import pytest
from reliability_helpers import (
    assert_ledger_exact,
    events,
    kill_session,
    launch,
    read_jsonl,
    tiny_config,
    train_steps,
    wait_for,
)

from engine.persist.checkpoint import latest_valid, list_checkpoints, step_of
from engine.runtime.driver import run
from engine.plan.run_plan import resolve_plan

pytestmark = pytest.mark.integration

EXTRA = ("rollout.total_rollout_steps=480", "checkpoint.every_versions=2", "data.max_response_length=8")
STEPS = 480 // 8


@pytest.mark.slow  # `make test`'s kill -9 chaos run (tests/reliability/test_deterministic_runs.py) covers kill + resume
def test_driver_killed_after_a_checkpoint_resumes_losslessly(tmp_path) -> None:
    run_dir = tmp_path / "run"
    proc = launch(run_dir, *EXTRA)
    try:
        wait_for(lambda: list_checkpoints(run_dir / "checkpoints"), timeout=240, proc=proc)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        kill_session(proc.pid)  # the Ray processes the launch started are gone too
        proc.stdout.close()
    trained_before = sum(e["status"] == "trained" for e in read_jsonl(run_dir / "ledger.jsonl"))
    assert trained_before < STEPS * 8, "the run finished before it was killed"
    ckpt = latest_valid(run_dir / "checkpoints")
    assert ckpt is not None

    cfg = tiny_config(run_dir, *EXTRA)
    assert run(resolve_plan(cfg), resume="auto", progress=False) == 0

    resumed = events(run_dir, "resume")
    assert len(resumed) == 1 and resumed[0]["step"] == step_of(ckpt) and resumed[0]["path"] == str(ckpt)
    steps = train_steps(run_dir)
    assert [s for s, _ in steps] == list(range(1, STEPS + 1))  # each step once: none lost, none counted twice
    assert all(version == step for step, version in steps)  # one sync per step: the version continues too
    assert_ledger_exact(cfg, run_dir, trained=STEPS * 8)
