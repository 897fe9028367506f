"""The engine with two trainer ranks (`resources.trainer.gpus_per_node = 2` on CPU: FSDP2 over gloo between the
`Trainer` actor and one `TrainerRank`), on a real local Ray with the tiny model."""

from __future__ import annotations

import collections
import math
from pathlib import Path

import pytest
from run_helpers import read_jsonl, tiny_config, train_records

from engine.runtime.driver import run
from engine.plan.run_plan import resolve_plan

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]

SMALL = ("trainer.ppo_mini_batch_size=8", "trainer.ppo_micro_batch_size_per_gpu=16", "rollout.n=4",
         "trainer.test_freq=0", "resources.trainer.gpus_per_node=2")


def _updates(recs: list[dict]) -> list[dict]:
    """The steps that took an optimizer step (a batch whose groups all had one reward trains nothing)."""
    return [r for r in recs if "actor/pg_loss" in r]


def _assert_accounted(run_dir: Path, steps: int, per_step: int) -> None:
    """Every admitted prompt is in the ledger exactly once: trained, dropped or in flight at the end."""
    ledger = read_jsonl(run_dir / "ledger.jsonl")
    uids = [e["uid"] for e in ledger]
    assert len(uids) == len(set(uids))
    status = collections.Counter(e["status"] for e in ledger)
    assert status["trained"] == steps * per_step
    assert set(status) <= {"trained", "dropped", "in_flight_at_end"}


def test_two_trainer_ranks_sync_the_replica_to_the_trained_weights(run_dir):
    # sync mode makes the weight check exact: the first step of each version trains on rollouts of the weights
    # the ranks just exported, so π_θ (both ranks' shards) and π_rollout (the replica) must agree
    cfg = tiny_config(run_dir, *SMALL, 'async_training.mode="sync"', "async_training.trigger_parameter_sync_step=2",
                      "rollout.total_rollout_steps=48", "trainer.use_kl_loss=true", "checkpoint.every_versions=2")
    assert run(resolve_plan(cfg), progress=False) == 0

    recs = train_records(run_dir)
    assert [r["training/global_step"] for r in recs] == list(range(1, 7))
    assert all(r["asyncrl/trainer/world_size"] == 2 for r in recs)
    assert [r["fully_async/count/current_param_version"] for r in recs] == [0, 1, 1, 2, 2, 3]
    updates = _updates(recs)
    assert len(updates) >= 3 and len(updates) + recs[-1]["asyncrl/count/skipped_updates"] == 6
    for r in updates:
        for key in ("actor/pg_loss", "actor/grad_norm", "actor/kl_loss", "critic/rewards/mean", "actor/entropy"):
            assert math.isfinite(r[key]), (key, r)
        assert r["actor/skipped_step"] == 0 and r["actor/grad_norm"] > 0
    firsts = [r for r in updates if r["training/global_step"] % 2 == 1]
    assert firsts and all(abs(r["rollout_corr/kl"]) < 1e-4 for r in firsts)  # the replica has the trained weights
    assert [e["step"] for e in read_jsonl(run_dir / "events.jsonl") if e["kind"] == "sync"] == [2, 4, 6]
    # both ranks wrote their part of the checkpoint (each rank its shards of the weights and optimizer, and its
    # RNG state: torch distributed checkpoint, nothing gathered)
    trainer_dir = run_dir / "checkpoints" / "global_step_4" / "trainer"
    assert {p.name for p in trainer_dir.iterdir()} >= {"dcp", "rng_rank0.pt", "rng_rank1.pt"}
    assert {p.name for p in (trainer_dir / "dcp").iterdir()} >= {"__0_0.distcp", "__1_0.distcp", ".metadata"}
    _assert_accounted(run_dir, 6, 8)


@pytest.mark.slow  # two ranks in decoupled mode also run in tests/megatron_trainer/test_megatron_async_run.py
def test_two_trainer_ranks_fully_async_decoupled(run_dir):
    # fully async with the proximal-policy snapshot: snapshot_params / proximal_log_probs run on both ranks
    cfg = tiny_config(run_dir, *SMALL, "async_training.trigger_parameter_sync_step=1",
                      "rollout.total_rollout_steps=48", "algorithm.rollout_correction.bypass_mode=false")
    assert run(resolve_plan(cfg), progress=False) == 0

    recs = train_records(run_dir)
    assert [r["training/global_step"] for r in recs] == list(range(1, 7))
    assert all(r["asyncrl/trainer/world_size"] == 2 for r in recs)
    assert [r["fully_async/count/current_param_version"] for r in recs] == list(range(1, 7))
    updates = _updates(recs)
    assert updates
    for r in updates:
        for key in ("actor/pg_loss", "actor/grad_norm", "timing_s/prox_log_probs", "asyncrl/is_ratio/mean"):
            assert math.isfinite(r[key]), (key, r)
    _assert_accounted(run_dir, 6, 8)


@pytest.mark.slow
def test_two_trainer_ranks_resume_after_the_trainer_dies(run_dir, capsys):
    # rank 0 dies at step 5 (its worker rank goes with it); the resume loads the step-4 checkpoint on both ranks
    extra = (*SMALL, "rollout.total_rollout_steps=64", "checkpoint.every_versions=2")
    assert run(resolve_plan(tiny_config(run_dir, *extra, "debug.kill_trainer_at_step=5")), progress=False) == 1
    assert "trainer failed" in capsys.readouterr().err
    assert run(resolve_plan(tiny_config(run_dir, *extra)), resume="auto", progress=False) == 0
    resumed = [e for e in read_jsonl(run_dir / "events.jsonl") if e["kind"] == "resume"]
    assert len(resumed) == 1 and resumed[0]["step"] == 4
    recs = train_records(run_dir)
    assert [r["training/global_step"] for r in recs] == list(range(1, 9))
    assert all(r["asyncrl/trainer/world_size"] == 2 for r in recs)
    _assert_accounted(run_dir, 8, 8)


def test_megatron_context_parallelism_is_refused_before_starting(run_dir, capsys):
    cfg = tiny_config(run_dir, *SMALL, 'trainer.backend="megatron"')  # validate refuses cp = 2 on CPU already;
    cfg = cfg.model_copy(update={"trainer": cfg.trainer.model_copy(update={"cp": 2})})  # the driver does too
    assert run(resolve_plan(cfg), progress=False) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "run failed" in err[0] and "trainer.cp = 2" in err[0] and "Traceback" not in err[0]
    assert not run_dir.exists()  # refused before the run directory is made or Ray starts


@pytest.mark.parametrize(("hardware", "resource"), [("h100", "GPU"), ("ascend-910b", "NPU")])
def test_a_run_needing_more_accelerators_than_the_cluster_has_fails_at_once(run_dir, capsys, hardware, resource):
    """On this CPU machine a CUDA/NPU preset asks for accelerators the local Ray does not have: one line, exit 1,
    no hang."""
    cfg = tiny_config(run_dir, f'resources.hardware="{hardware}"')
    assert run(resolve_plan(cfg), progress=False) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert f"run failed: the Ray cluster has 0 {resource}(s), this run needs 2 (1 rollout replica(s) × 1 + 1 trainer" \
        in err[-1] and "Traceback" not in err[-1]
    assert not (run_dir / "metrics.jsonl").exists()


@pytest.mark.slow
def test_ulysses_sp_group_of_two_ranks_trains_and_syncs(run_dir):
    """Ulysses SP 2 on the two ranks (one SP group, DP 1; the tiny model's 2 heads split, its KV head repeated):
    the policy and the KL reference forward half of each row's positions per rank, the run trains, and after each
    sync π_θ of the SP forward equals the replica's π_rollout."""
    cfg = tiny_config(run_dir, *SMALL, 'async_training.mode="sync"', "async_training.trigger_parameter_sync_step=2",
                      "rollout.total_rollout_steps=32", "trainer.use_kl_loss=true",
                      "trainer.ulysses_sequence_parallel_size=2")
    assert run(resolve_plan(cfg), progress=False) == 0
    recs = train_records(run_dir)
    assert [r["training/global_step"] for r in recs] == list(range(1, 5))
    updates = _updates(recs)
    assert updates and all(r["actor/grad_norm"] > 0 and math.isfinite(r["actor/kl_loss"]) for r in updates)
    firsts = [r for r in updates if r["training/global_step"] % 2 == 1]
    assert firsts and all(abs(r["rollout_corr/kl"]) < 1e-4 for r in firsts)
    _assert_accounted(run_dir, 4, 8)
