"""`trainer.deterministic = true` on a real local Ray with the tiny preset: a fully async run at staleness 0 and
sync interval 1 trains exactly the batches of `mode = "sync"` and ends with the same weights hash; a run
whose driver, trainer actor or rollout replica is killed with kill -9 at a random moment after a checkpoint
(and resumed with `--resume auto` where the run died) ends with the uninterrupted run's ledger, metrics from
the checkpoint on, and final weights hash. Set ASYNCRL_CHAOS_SEED to replay a seed."""

from __future__ import annotations

import os
import random
import time

import pytest
from chaos_helpers import (
    DETERMINISTIC,
    assert_same_checkpoint_hashes,
    chaos_run,
    final_hash,
    ledger_by_step,
    step_metrics,
)
from reliability_helpers import assert_ledger_exact, events, tiny_config, train_steps

from engine.runtime.driver import run
from engine.plan.run_plan import resolve_plan

pytestmark = pytest.mark.integration

STEPS = 24
EXTRA = (*DETERMINISTIC, f"rollout.total_rollout_steps={STEPS * 8}", "checkpoint.every_versions=4")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted fully async deterministic run."""
    run_dir = tmp_path_factory.mktemp("det") / "reference"
    assert run(resolve_plan(tiny_config(run_dir, *EXTRA, "name=det-reference")), progress=False) == 0
    assert [s for s, _ in train_steps(run_dir)] == list(range(1, STEPS + 1))
    return run_dir


def test_async_at_staleness_0_trains_the_batches_of_sync_mode(reference, tmp_path) -> None:
    run_dir = tmp_path / "sync"
    assert run(resolve_plan(tiny_config(run_dir, *EXTRA, "async_training.mode=sync", "name=det-sync")), progress=False) == 0
    assert ledger_by_step(run_dir) == ledger_by_step(reference)  # the same prompts in the same steps
    assert step_metrics(run_dir) == step_metrics(reference)  # the same rewards, losses, staleness, ...
    assert final_hash(run_dir) == final_hash(reference)
    assert_same_checkpoint_hashes(run_dir, reference, "sync vs async")


def test_killed_with_kill_9_and_resumed_ends_bit_identical(reference, tmp_path) -> None:
    """The short chaos variant: one kill -9 of the driver, the trainer actor or the replica, chosen at random."""
    seed = int(os.environ.get("ASYNCRL_CHAOS_SEED", time.time_ns() % 10_000))
    run_dir = tmp_path / "run"
    extra = (*EXTRA, "name=det-killed")
    killed = chaos_run(run_dir, extra, kills=1, rng=random.Random(seed))
    why = f"seed {seed}, killed {killed}"
    cfg = tiny_config(run_dir, *extra)
    resumed = events(run_dir, "resume")
    assert len(resumed) == (0 if killed[0].startswith("replica") else 1), why
    since = resumed[0]["step"] if resumed else 0
    assert [s for s, _ in train_steps(run_dir)] == list(range(1, STEPS + 1)), why
    assert_ledger_exact(cfg, run_dir, trained=STEPS * 8)
    assert ledger_by_step(run_dir) == ledger_by_step(reference), why
    assert step_metrics(run_dir, since) == step_metrics(reference, since), why
    assert final_hash(run_dir) == final_hash(reference), why
    assert_same_checkpoint_hashes(run_dir, reference, why)
