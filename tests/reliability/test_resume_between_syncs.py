"""A deterministic run stopped gracefully between two syncs (`trigger_parameter_sync_step = 2`, the stop
checkpoint at an odd step, with prompts in flight) and resumed ends bit-identical to the uninterrupted run:
the resumed replicas are given the version's own weights (the snapshot of the last sync, written into the
checkpoint), not the trainer's weights one step past it — in bypass mode and in decoupled mode (where the
same snapshot is π_prox). The soak found the difference (issue 48); without the fix the final hashes differ."""

from __future__ import annotations

import pytest
from chaos_helpers import final_hash, ledger_by_step, step_metrics
from reliability_helpers import assert_ledger_exact, events, tiny_config, train_steps

from engine.persist.checkpoint import latest_valid, read_checkpoint
from engine.plan.run_plan import resolve_plan
from engine.runtime.driver import run

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STEPS, STOP_AT = 8, 5
EXTRA = ("trainer.deterministic=true", "async_training.staleness_threshold=0.5",
         "async_training.trigger_parameter_sync_step=2", "data.max_response_length=4",
         f"rollout.total_rollout_steps={STEPS * 8}", "checkpoint.every_versions=100")
MODES = {"bypass": "algorithm.rollout_correction.bypass_mode=true",
         "decoupled": "algorithm.rollout_correction.bypass_mode=false"}


@pytest.mark.parametrize("mode", list(MODES))
def test_stopped_between_two_syncs_and_resumed_ends_bit_identical(mode, tmp_path) -> None:
    extra = (*EXTRA, MODES[mode])
    reference = tmp_path / "reference"
    assert run(resolve_plan(tiny_config(reference, *extra, f"name=between-ref-{mode}")), progress=False) == 0

    run_dir = tmp_path / "run"
    cfg = tiny_config(run_dir, *extra, f"name=between-{mode}", f"debug.stop_at_step={STOP_AT}")
    assert run(resolve_plan(cfg), progress=False) == 0
    ckpt = read_checkpoint(latest_valid(run_dir / "checkpoints"))
    state = ckpt["state"]
    assert (state["reason"], state["step"], state["since_sync"]) == ("stop", STOP_AT, 1)
    assert state["version_weights"] and ckpt["in_flight"], "a stop between two syncs with prompts in flight"

    assert run(resolve_plan(cfg), resume="auto", progress=False) == 0
    resumed = events(run_dir, "resume")
    assert resumed[0]["step"] == STOP_AT and "the replicas get version" in resumed[0]["message"]
    assert [s for s, _ in train_steps(run_dir)] == list(range(1, STEPS + 1))
    assert_ledger_exact(cfg, run_dir, trained=STEPS * 8)
    assert ledger_by_step(run_dir) == ledger_by_step(reference)
    assert step_metrics(run_dir, STOP_AT) == step_metrics(reference, STOP_AT)
    assert final_hash(run_dir) == final_hash(reference)
