"""Sync mode with the tiny Qwen3-VL: generate → train → sync over the same actors; at staleness 0 the rollout's
log-probs with images are the trainer's (fp32), so the mismatch KL of each version's first step is ~0."""

from __future__ import annotations

from pathlib import Path

import pytest
from mm_helpers import tiny_vl_config, train_records

from engine.runtime.driver import run
from engine.plan.run_plan import resolve_plan

pytestmark = pytest.mark.integration


@pytest.mark.slow  # `make test` runs images fully async (test_mm_async_run.py) and text in sync mode
def test_sync_mode_is_on_policy(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    cfg = tiny_vl_config(run_dir, 'async_training.mode="sync"', "async_training.trigger_parameter_sync_step=2",
                         "rollout.total_rollout_steps=32", "trainer.ppo_mini_batch_size=4", "trainer.test_freq=0")
    assert run(resolve_plan(cfg), progress=False) == 0
    recs = train_records(run_dir)
    assert len(recs) == 8 and all(r["asyncrl/staleness/max"] == 0 for r in recs)
    firsts = [r for r in recs if r["training/global_step"] % 2 == 1]
    assert all(abs(r["rollout_corr/kl"]) < 1e-4 for r in firsts)
