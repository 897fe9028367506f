"""A real tiny run takes verl's optimizer steps per local step and raises no mismatch alarm in fp32."""

from __future__ import annotations

import pytest

from engine.runtime.driver import run
from engine.plan.run_plan import resolve_plan
from run_helpers import read_jsonl, tiny_config, train_records

pytestmark = pytest.mark.integration


def test_two_mini_batches_two_epochs_at_trigger_4_fp32(run_dir):
    cfg = tiny_config(run_dir, "trainer.ppo_mini_batch_size=4", "trainer.ppo_micro_batch_size_per_gpu=16",
                      "rollout.n=4", "rollout.total_rollout_steps=96", "trainer.test_freq=0",
                      "async_training.require_batches=2", "trainer.ppo_epochs=2",
                      "async_training.trigger_parameter_sync_step=4", "async_training.staleness_threshold=0.5")
    assert run(resolve_plan(cfg), progress=False) == 0
    recs = train_records(run_dir)
    assert len(recs) == 12
    assert all(r["asyncrl/trainer/optimizer_steps"] == 4 for r in recs)
    assert [r["actor/optimizer_step"] for r in recs] == [4 * k for k in range(1, 13)]
    assert all(r["fully_async/count/current_param_version"] >= 0 for r in recs)
    # the first step after each sync compares same-weight rows; nothing in fp32 is a numeric mismatch
    assert any(r.get("asyncrl/mismatch/rows", 0) > 0 for r in recs)
    assert max(abs(r["asyncrl/mismatch/kl"]) for r in recs if "asyncrl/mismatch/kl" in r) < 1e-3
    events = read_jsonl(run_dir / "events.jsonl")
    assert not [e for e in events if e.get("alarm") == "mismatch"]
    assert all(r["asyncrl/mismatch_alarm"] == 0.0 for r in recs)
