"""`trainer.deterministic = true` on a real local Ray with the tiny preset: a fully async run at staleness 0 and
sync interval 1 trains exactly the batches of `mode = "sync"` and ends with the same weights hash; a run
killed with kill -9 at a random moment after its first checkpoint and resumed with `--resume auto` ends with
the uninterrupted run's ledger, metrics from the checkpoint on, and final weights hash."""

from __future__ import annotations

import os
import random
import signal
import time

import pytest
from chaos_helpers import DETERMINISTIC, final_hash, ledger_by_step, step_metrics
from reliability_helpers import assert_ledger_exact, events, kill_session, launch, tiny_config, train_steps, wait_for

from engine.runtime.checkpoint import latest_valid, list_checkpoints, step_of
from engine.runtime.driver import run

pytestmark = pytest.mark.integration

STEPS = 40
EXTRA = (*DETERMINISTIC, f"rollout.total_rollout_steps={STEPS * 8}", "checkpoint.every_versions=4")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted fully async deterministic run."""
    run_dir = tmp_path_factory.mktemp("det") / "reference"
    assert run(tiny_config(run_dir, *EXTRA, "name=det-reference"), progress=False) == 0
    assert [s for s, _ in train_steps(run_dir)] == list(range(1, STEPS + 1))
    return run_dir


def test_async_at_staleness_0_trains_the_batches_of_sync_mode(reference, tmp_path) -> None:
    run_dir = tmp_path / "sync"
    assert run(tiny_config(run_dir, *EXTRA, "async_training.mode=sync", "name=det-sync"), progress=False) == 0
    assert ledger_by_step(run_dir) == ledger_by_step(reference)  # the same prompts in the same steps
    assert step_metrics(run_dir) == step_metrics(reference)  # the same rewards, losses, staleness, ...
    assert final_hash(run_dir) == final_hash(reference)


def test_killed_with_kill_9_and_resumed_ends_bit_identical(reference, tmp_path) -> None:
    seed = int(os.environ.get("ASYNCRL_CHAOS_SEED", time.time_ns() % 10_000))
    delay = random.Random(seed).uniform(0.0, 2.0)
    run_dir = tmp_path / "run"
    proc = launch(run_dir, *EXTRA, "name=det-killed")
    try:
        wait_for(lambda: list_checkpoints(run_dir / "checkpoints"), timeout=240, proc=proc)
        time.sleep(delay)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        kill_session(proc.pid)
        proc.stdout.close()
    ckpt = latest_valid(run_dir / "checkpoints")
    assert ckpt is not None
    cfg = tiny_config(run_dir, *EXTRA, "name=det-killed")
    assert run(cfg, resume="auto", progress=False) == 0, f"seed {seed}"

    if step_of(ckpt) < STEPS:  # else the kill came after the final checkpoint: nothing was left to resume
        assert len(events(run_dir, "resume")) == 1, f"seed {seed}"
    assert [s for s, _ in train_steps(run_dir)] == list(range(1, STEPS + 1)), f"seed {seed}"
    assert_ledger_exact(cfg, run_dir, trained=STEPS * 8)
    assert ledger_by_step(run_dir) == ledger_by_step(reference), f"seed {seed}"
    assert step_metrics(run_dir, step_of(ckpt)) == step_metrics(reference, step_of(ckpt)), f"seed {seed}"
    assert final_hash(run_dir) == final_hash(reference), f"seed {seed} (killed {delay:.2f} s after a checkpoint)"
