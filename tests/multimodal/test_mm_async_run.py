"""The tiny Qwen3-VL on the figure task through the whole engine on a real local Ray: images travel from the
dataset to the `hf` replicas (with resumed prefixes) and the torch trainer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mm_helpers import tiny_vl_config, train_records

from engine.runtime.driver import run
from engine.plan.run_plan import resolve_plan

pytestmark = pytest.mark.integration


def test_fully_async_with_partial_rollout_and_staleness(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    # one prompt per replica call and long responses: syncs land while sequences are in flight
    cfg = tiny_vl_config(run_dir, "rollout.total_rollout_steps=48", "trainer.ppo_mini_batch_size=4", "rollout.n=8",
                         "rollout.max_num_seqs=8", "data.max_response_length=32", "trainer.test_freq=0",
                         "async_training.staleness_threshold=1.0", "async_training.partial_rollout=true")
    assert run(resolve_plan(cfg), progress=False) == 0
    recs = train_records(run_dir)
    assert [r["training/global_step"] for r in recs] == list(range(1, 13))
    assert sum(r["fully_async/partial/total_partial_num"] for r in recs) > 0
    assert max(r["asyncrl/staleness/max"] for r in recs) >= 1
    assert all(r["response_length/max"] <= 32 for r in recs)
    # at staleness 0 the rollout's log-probs are the trainer's (fp32): mismatch KL ~ 0
    fresh = [r for r in recs if r["asyncrl/staleness/max"] == 0]
    assert fresh and all(abs(r["rollout_corr/kl"]) < 1e-4 for r in fresh)
    # rewards come from the figures scorer (a random policy reaches its first rungs)
    assert max(r["critic/rewards/max"] for r in recs) > 0
    assert recs[-1]["data/filtered_bad_image"] == 0 and recs[-1]["data/filtered_image_mismatch"] == 0
    ledger = [json.loads(x) for x in (run_dir / "ledger.jsonl").read_text().splitlines()]
    assert sum(e["status"] == "trained" for e in ledger) == 48
