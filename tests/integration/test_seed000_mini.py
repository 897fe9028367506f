"""The shrunk seed 000 (`presets/runs/seed000-mini-cpu.toml`) end to end: Megatron EP 2 × DP 2 trainer, 2 hf
replicas, fully async, decoupled IS with the Megatron π_prox, collective weight sync over gloo — and it learns."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
from run_helpers import read_jsonl, train_records

pytest.importorskip("megatron.core")

pytestmark = [pytest.mark.megatron, pytest.mark.integration]

PRESET = Path(__file__).resolve().parents[2] / "presets" / "runs" / "seed000-mini-cpu.toml"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_seed000_mini_cpu_learns_with_the_production_code_paths(run_dir: Path) -> None:
    from asyncrl_cli.config import load_run_config
    from engine.runtime.driver import run
    from engine.plan.run_plan import resolve_plan

    res = load_run_config(PRESET, [f'logging.run_dir="{run_dir}"', "logging.progress=false"])
    assert res.config is not None
    assert run(resolve_plan(res.config), progress=False) == 0
    recs = train_records(run_dir)
    assert len(recs) == 150
    q = len(recs) // 4
    first, last = (statistics.mean(r["critic/rewards/mean"] for r in part) for part in (recs[:q], recs[-q:]))
    assert last - first >= 0.2, (first, last)
    assert all(r["asyncrl/trainer/world_size"] == 2 for r in recs)
    assert all("rollout_corr/kl" in r and "timing_s/prox_log_probs" in r for r in recs)
    syncs = [e for e in read_jsonl(run_dir / "events.jsonl") if e["kind"] == "sync"]
    assert len(syncs) == 150 and all(e["bytes"] > 0 for e in syncs)


@pytest.mark.timeout(400)
def test_seed000_layout_in_sync_mode_gives_the_replicas_exactly_the_trained_weights(run_dir: Path) -> None:
    """Sync mode makes it exact: every step trains on rollouts of the weights just broadcast, so the Megatron
    EP 2 ranks' π_prox and both hf replicas' π_rollout agree on every token — the EP gather, the collective
    broadcast and the per-expert → fused-expert load are all lossless."""
    from asyncrl_cli.config import load_run_config
    from engine.runtime.driver import run
    from engine.plan.run_plan import resolve_plan

    res = load_run_config(PRESET, [f'logging.run_dir="{run_dir}"', "logging.progress=false",
                                   'async_training.mode="sync"', "async_training.staleness_threshold=0",
                                   "async_training.partial_rollout=false", "rollout.total_rollout_steps=64"])
    assert res.config is not None
    assert run(resolve_plan(res.config), progress=False) == 0
    recs = train_records(run_dir)
    assert [r["fully_async/count/current_param_version"] for r in recs] == [1, 2, 3, 4]  # a sync every step
    assert all(abs(r["rollout_corr/kl"]) < 1e-5 for r in recs), [r["rollout_corr/kl"] for r in recs]
