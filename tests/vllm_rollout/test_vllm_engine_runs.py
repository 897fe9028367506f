"""Whole runs through `engine.runtime.driver.run` on a real local Ray with `rollout.backend = "vllm"`: the
tiny preset with vLLM rollout + the torch trainer (fully async) and vLLM rollout + the Megatron trainer
(sync mode). Each run must exit 0, bump the version at every sync, account for every prompt exactly once,
and — with staleness 0 — the vLLM rollout log-probs must be the trainer's own at the first local step of
each version (fp32 both sides): |rollout_corr/kl| = |mean(log q_vllm − log π_θ)| < 1e-3."""

from __future__ import annotations

import collections
from pathlib import Path

import pytest
from vllm_tiny_model import have_vllm, integration_run_helpers

if not have_vllm():
    pytest.skip("vllm is not installed (run `make test-vllm`)", allow_module_level=True)

pytestmark = [pytest.mark.vllm, pytest.mark.integration, pytest.mark.timeout(300)]

TRIGGER = 2
STEPS = 4  # local steps: total_rollout_steps / ppo_mini_batch_size
PROMPTS_PER_STEP = 8
SMALL = (
    'rollout.backend="vllm"',
    f"trainer.ppo_mini_batch_size={PROMPTS_PER_STEP}",
    "trainer.ppo_micro_batch_size_per_gpu=16",
    "rollout.n=4",
    f"rollout.total_rollout_steps={STEPS * PROMPTS_PER_STEP}",
    "trainer.test_freq=0",
    f"async_training.trigger_parameter_sync_step={TRIGGER}",
)


H = integration_run_helpers()


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return tmp_path / "run"


def _check_run(run_dir: Path) -> list[dict]:
    """The assertions every run must pass; returns the per-step train records."""
    recs = H.train_records(run_dir)
    assert [r["training/global_step"] for r in recs] == list(range(1, STEPS + 1))
    # one sync every TRIGGER local steps, each bumping the version the next steps train against
    assert [r["fully_async/count/current_param_version"] for r in recs] == [
        k // TRIGGER for k in range(1, STEPS + 1)
    ]
    syncs = [e for e in H.read_jsonl(run_dir / "events.jsonl") if e["kind"] == "sync"]
    assert [e["step"] for e in syncs] == list(range(TRIGGER, STEPS + 1, TRIGGER))
    assert all(r["timing_s/param_sync"] > 0 for r in recs if r["training/global_step"] % TRIGGER == 0)
    # every admitted prompt is accounted for exactly once
    ledger = H.read_jsonl(run_dir / "ledger.jsonl")
    uids = [e["uid"] for e in ledger]
    assert len(uids) == len(set(uids))
    status = collections.Counter(e["status"] for e in ledger)
    assert status["trained"] == STEPS * PROMPTS_PER_STEP
    assert set(status) <= {"trained", "dropped", "in_flight_at_end"}
    # vLLM generated the tokens: responses are non-empty and rollout throughput is reported (a windowed rate,
    # 0 in a window with no finished generation)
    assert all(r["response_length/mean"] > 0 for r in recs)
    assert max(r["asyncrl/rollout/tokens_per_s"] for r in recs) > 0
    # staleness 0: trained on the current version's samples only, and at the first local step of each version
    # the trainer's weights are the ones vLLM sampled with
    assert all(r["asyncrl/staleness/max"] == 0 for r in recs)
    firsts = [r for r in recs if r["training/global_step"] % TRIGGER == 1]
    assert firsts and all(abs(r["rollout_corr/kl"]) < 1e-3 for r in firsts), [
        r["rollout_corr/kl"] for r in firsts
    ]
    return recs


def test_vllm_rollout_with_torch_trainer_fully_async(run_dir: Path) -> None:
    cfg = H.tiny_config(
        run_dir,
        *SMALL,
        'trainer.backend="torch"',
        'async_training.mode="fully_async"',
        "async_training.staleness_threshold=0.0",
        "async_training.partial_rollout=false",
    )
    assert _run(cfg) == 0
    _check_run(run_dir)


def test_vllm_rollout_with_megatron_trainer_sync_mode(run_dir: Path) -> None:
    pytest.importorskip("megatron.core", reason="megatron-core is not installed in the vLLM venv")
    cfg = H.tiny_config(run_dir, *SMALL, 'trainer.backend="megatron"', 'async_training.mode="sync"')
    assert _run(cfg) == 0
    recs = _check_run(run_dir)
    assert all(r["fully_async/partial/total_partial_num"] == 0 for r in recs)


def _run(cfg: object) -> int:
    from engine.runtime.driver import run
    from engine.plan.run_plan import resolve_plan

    return run(resolve_plan(cfg), progress=False)
