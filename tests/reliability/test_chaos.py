"""Chaos (slow): the tiny preset in deterministic mode — rollout staleness 0.5, a sync every 2 local steps — is
killed with kill -9 three times, each time at a random moment after a new checkpoint and in a process chosen at
random (the driver, the trainer actor or the rollout replica), and resumed with `--resume auto` whenever the
kill ended the launch. Every prompt is trained exactly once, the steps are contiguous, and the final weights
hash, the ledger and the per-step metrics are the uninterrupted run's. ASYNCRL_CHAOS_SEED replays a seed."""

from __future__ import annotations

import os
import random
import time

import pytest
from chaos_helpers import assert_same_checkpoint_hashes, chaos_run, final_hash, ledger_by_step, step_metrics
from reliability_helpers import assert_ledger_exact, tiny_config, train_steps

from engine.runtime.driver import run
from engine.plan.run_plan import resolve_plan

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STEPS = 60
EXTRA = ("trainer.deterministic=true", "async_training.staleness_threshold=0.5",
         "async_training.trigger_parameter_sync_step=2", "data.max_response_length=4",
         f"rollout.total_rollout_steps={STEPS * 8}", "checkpoint.every_versions=2")


def test_three_random_kill_9s_end_with_the_uninterrupted_weights(tmp_path) -> None:
    seed = int(os.environ.get("ASYNCRL_CHAOS_SEED", time.time_ns() % 10_000))
    reference = tmp_path / "reference"
    assert run(resolve_plan(tiny_config(reference, *EXTRA, "name=chaos-reference")), progress=False) == 0

    run_dir = tmp_path / "chaos"
    extra = (*EXTRA, "name=chaos-run")
    killed = chaos_run(run_dir, extra, kills=3, rng=random.Random(seed))
    why = f"seed {seed}, killed {killed}"
    assert len(killed) == 3, why
    assert [s for s, _ in train_steps(run_dir)] == list(range(1, STEPS + 1)), why
    assert_ledger_exact(tiny_config(run_dir, *extra), run_dir, trained=STEPS * 8)
    assert ledger_by_step(run_dir) == ledger_by_step(reference), why
    assert step_metrics(run_dir) == step_metrics(reference), why
    assert final_hash(run_dir) == final_hash(reference), why
    assert_same_checkpoint_hashes(run_dir, reference, why)
