"""A short fully async run of the real engine (local Ray, tiny model, copy task) with the Megatron trainer
in decoupled rollout-correction mode: proximal snapshots every sync, checkpoints saved along the way."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.megatron, pytest.mark.integration, pytest.mark.timeout(300)]

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))


@pytest.mark.slow  # the two-rank run below is decoupled too and checkpoints as well
def test_tiny_async_run_with_megatron_trainer_in_decoupled_mode(tmp_path: Path) -> None:
    from run_helpers import tiny_config, train_records

    from engine.runtime.driver import run
    from engine.plan.run_plan import resolve_plan

    run_dir = tmp_path / "run"
    cfg = tiny_config(run_dir, 'trainer.backend="megatron"', "trainer.ppo_mini_batch_size=8",
                      "trainer.ppo_micro_batch_size_per_gpu=16", "rollout.n=4", "rollout.total_rollout_steps=48",
                      "trainer.test_freq=0", "async_training.trigger_parameter_sync_step=2",
                      "algorithm.rollout_correction.bypass_mode=false", "checkpoint.every_versions=2")
    assert run(resolve_plan(cfg), progress=False) == 0
    recs = train_records(run_dir)
    assert [r["training/global_step"] for r in recs] == list(range(1, 7))
    assert all(r["actor/skipped_step"] == 0 and r["actor/grad_norm"] > 0 for r in recs)
    assert all("timing_s/prox_log_probs" in r for r in recs)  # π_prox recomputed with the snapshot every step
    assert [r["fully_async/count/current_param_version"] for r in recs] == [0, 1, 1, 2, 2, 3]
    # the periodic checkpoint at version 2 (local step 4) was written in decoupled mode (verl #6026)
    ckpt = run_dir / "checkpoints" / "global_step_4" / "trainer"
    assert (ckpt / "model.safetensors").exists() and (ckpt / "prox_rank0.pt").exists()
    assert json.loads((ckpt / "trainer_state.json").read_text())["backend"] == "megatron"


def test_tiny_async_run_with_two_megatron_trainer_ranks(tmp_path: Path) -> None:
    """Megatron DP 2 through the driver: the `Trainer` actor and one `TrainerRank` in one gloo world, each DP rank
    its half of every batch, decoupled mode (π_prox from both ranks' snapshots), a sharded checkpoint."""
    run_dir, _recs = _two_rank_decoupled_run(tmp_path, "trainer.ppo_micro_batch_size_per_gpu=16")
    ckpt = run_dir / "checkpoints" / "global_step_2" / "trainer"
    assert {"model.safetensors", "optimizer_rank0.pt", "optimizer_rank1.pt", "rng_rank1.pt"} <= \
        {p.name for p in ckpt.iterdir()}


def test_tiny_async_run_with_a_two_stage_megatron_pipeline_and_collective_sync(tmp_path: Path) -> None:
    """Megatron PP 2 through the driver: the `Trainer` actor (stage 0) and one `TrainerRank` (stage 1), both given
    every row; the 1F1B schedule over gloo, π_prox computed on the last stage and broadcast, the weights gathered
    across the stages and broadcast to the replicas over the collective group, a checkpoint of both stages."""
    run_dir, recs = _two_rank_decoupled_run(tmp_path, "trainer.pp=2", "trainer.ppo_micro_batch_size_per_gpu=4",
                                            'rollout.weight_sync="collective"', "rollout.max_replica_restarts=0")
    assert [r["fully_async/count/current_param_version"] for r in recs] == [0, 1, 1, 2]
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    synced = [e["bytes"] for e in events if e["kind"] == "sync"]
    ckpt = run_dir / "checkpoints" / "global_step_2" / "trainer"
    from safetensors.torch import load_file

    saved = load_file(str(ckpt / "model.safetensors"))  # gathered from both stages (the tied head left out)
    full = sum(t.numel() * 4 for t in saved.values())
    head = 0 if "lm_head.weight" in saved else saved["model.embed_tokens.weight"].numel() * 4
    assert synced == [full + head] * 2  # every sync carried the fp32 weights of both stages
    assert {"model.safetensors", "optimizer_rank0.pt", "optimizer_rank1.pt"} <= {p.name for p in ckpt.iterdir()}
    assert json.loads((ckpt / "trainer_state.json").read_text())["layout"] == [1, 2, 1, 1, 2]


def _two_rank_decoupled_run(tmp_path: Path, *extra: str) -> tuple[Path, list[dict]]:
    """A 4-step fully async run (sync every 2 steps, decoupled mode, a checkpoint per version) on two Megatron
    ranks with `extra` overrides; checks what every such run must show: steps 1..4 on 2 ranks, updates with a
    gradient and π_prox. Returns the run dir and the training records."""
    from run_helpers import tiny_config, train_records

    from engine.runtime.driver import run
    from engine.plan.run_plan import resolve_plan

    run_dir = tmp_path / "run"
    cfg = tiny_config(run_dir, 'trainer.backend="megatron"', "resources.trainer.gpus_per_node=2",
                      "trainer.ppo_mini_batch_size=8", "rollout.n=4", "rollout.total_rollout_steps=32",
                      "trainer.test_freq=0", "async_training.trigger_parameter_sync_step=2",
                      "algorithm.rollout_correction.bypass_mode=false", "checkpoint.every_versions=1", *extra)
    assert run(resolve_plan(cfg), progress=False) == 0
    recs = train_records(run_dir)
    assert [r["training/global_step"] for r in recs] == list(range(1, 5))
    assert all(r["asyncrl/trainer/world_size"] == 2 for r in recs)
    updates = [r for r in recs if "actor/pg_loss" in r]  # a batch whose groups all had one reward trains nothing
    assert updates and all(r["actor/grad_norm"] > 0 and "timing_s/prox_log_probs" in r for r in updates)
    return run_dir, recs
