"""The mismatch alarm measures numeric mismatch (same weights, different numbers), not policy drift."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from trainer_helpers import EOS, PAD, VOCAB

from engine.algo.loss import build_loss_fn
from engine.algo.mismatch import mismatch_report, same_weight_rows
from engine.rollout.base import SamplingParams
from engine.rollout.hf.backend import HFRolloutBackend
from engine.algo.batching import AT_VERSION, ROW_INDEX, LogRatioObserver, mismatch_check
from engine.trainer.batch import collate
from engine.trainer.torch_trainer import TorchTrainerBackend
from engine.types import GenRequest, Trajectory

RC = SimpleNamespace(bypass_mode=True, mismatch_kl_bound=0.05, mismatch_ppl_ratio_bound=1.2, mismatch_chi2_bound=1.0,
                     rollout_is=None, rollout_is_threshold=2.0, rollout_is_batch_normalize=False, rollout_rs=None,
                     rollout_rs_threshold=None, loss_type="ppo_clip")
TRAINER = SimpleNamespace(loss_agg_mode="token-mean")
BOUNDS = {"kl_bound": 0.05, "ppl_ratio_bound": 1.2, "chi2_bound": 1.0}


def _peaked_model() -> torch.nn.Module:
    """The tiny Qwen with a large init range: peaked next-token distributions, like a trained model's."""
    from engine.models.tiny import build_tiny_model

    return build_tiny_model(VOCAB, PAD, EOS, seed=0, layers=2, initializer_range=1.0)


def _rollout_batch(sampler_model: torch.nn.Module, version: int = 0):
    sampler = HFRolloutBackend(sampler_model, eos_token_id=EOS, pad_token_id=PAD)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(2, VOCAB, (5,), generator=gen).tolist() for _ in range(6)]
    reqs = [GenRequest(f"{i}/{j}", p, max_new_tokens=6) for i, p in enumerate(prompts) for j in range(4)]
    results = sampler.generate(reqs, SamplingParams(temperature=1.0, seed=1))
    rows = [(q.prompt_ids, Trajectory(r.response_ids, r.log_probs, r.finish_reason, version, version,
                                      float(j % 2))) for j, (q, r) in enumerate(zip(reqs, results))]
    batch = collate(rows, pad_token_id=PAD)
    batch.advantages = (batch.meta["rewards"][:, None] - 0.5) * batch.response_mask
    batch.old_log_probs = batch.rollout_log_probs
    batch.meta[ROW_INDEX] = list(range(len(batch)))
    batch.meta[AT_VERSION] = [version == 0] * len(batch)  # the trainer is at version 0
    return batch


def _train_and_check(trainer_model, sampler_model, *, mini_batches=1, weights_moved=False, version=0, rc=RC):
    batch = _rollout_batch(sampler_model, version)
    trainer = TorchTrainerBackend(trainer_model, optim_cfg={"lr": 1e-2}, micro_batch_size=8, mini_batches=mini_batches)
    if not rc.bypass_mode:
        trainer.snapshot_params()
        batch.old_log_probs = trainer.proximal_log_probs(batch)
    observer = LogRatioObserver(build_loss_fn(TRAINER, rc))
    trainer.train_step(batch, observer)
    observer.take()
    return mismatch_check(batch, observer, rc, version=0, weights_moved=weights_moved)


def test_fp32_rollout_and_fp32_trainer_raise_no_alarm_even_with_several_updates() -> None:
    model = _peaked_model()
    metrics, alarms = _train_and_check(copy.deepcopy(model), model, mini_batches=2)
    assert alarms == []
    assert metrics["asyncrl/mismatch/rows"] == 12 and abs(metrics["asyncrl/mismatch/kl"]) < 1e-4
    # the second mini-batch was forwarded after an optimizer step: drift, reported apart, never an alarm
    assert metrics["asyncrl/mismatch/drift_rows"] == 12 and metrics["asyncrl/mismatch/drift_kl"] != 0.0


def test_moved_weights_are_drift_not_mismatch() -> None:
    model = _peaked_model()
    moved = copy.deepcopy(model)
    with torch.no_grad():
        for p in moved.parameters():
            p.add_(0.3 * torch.randn_like(p))
    metrics, alarms = _train_and_check(moved, model, weights_moved=True)
    assert alarms == [] and metrics["asyncrl/mismatch/rows"] == 0 and "asyncrl/mismatch/kl" not in metrics
    assert abs(metrics["asyncrl/mismatch/drift_kl"]) > 0.05  # the gap the old alarm reported as mismatch


def test_bf16_rollout_against_an_fp32_trainer_raises_the_alarm() -> None:
    model = _peaked_model()
    metrics, alarms = _train_and_check(copy.deepcopy(model), copy.deepcopy(model).to(torch.bfloat16))
    assert metrics["asyncrl/mismatch/rows"] == 24
    assert alarms and all("train-inference mismatch" in a for a in alarms)


def test_decoupled_mode_compares_the_proximal_snapshot_whatever_the_updates() -> None:
    decoupled = SimpleNamespace(**{**vars(RC), "bypass_mode": False})
    model = _peaked_model()
    metrics, alarms = _train_and_check(copy.deepcopy(model), model, mini_batches=2, weights_moved=True, rc=decoupled)
    assert alarms == [] and metrics["asyncrl/mismatch/rows"] == 24 and abs(metrics["asyncrl/mismatch/kl"]) < 1e-4
    metrics, alarms = _train_and_check(copy.deepcopy(model), copy.deepcopy(model).to(torch.bfloat16), rc=decoupled)
    assert alarms and metrics["asyncrl/mismatch/rows"] == 24


def test_rows_generated_at_older_weights_count_as_drift_in_decoupled_mode() -> None:
    train = torch.zeros(4, 3)
    rollout = torch.tensor([[0.0] * 3, [0.0] * 3, [-0.5] * 3, [-0.5] * 3])
    mask = torch.ones(4, 3)
    same = same_weight_rows(torch.tensor([2, 2, 1, 2]), torch.tensor([2, 2, 2, 2]), version=2)
    assert same.tolist() == [True, True, False, True]
    metrics, alarms = mismatch_report(train, rollout, mask, same, **BOUNDS)
    assert metrics["asyncrl/mismatch/rows"] == 3 and metrics["asyncrl/mismatch/drift_rows"] == 1
    assert metrics["asyncrl/mismatch/drift_kl"] == -0.5
    assert metrics["asyncrl/mismatch/kl"] == pytest.approx(-0.5 / 3) and alarms  # row 3: at the snapshot
    metrics, alarms = mismatch_report(train, rollout, mask, torch.tensor([True, True, False, False]), **BOUNDS)
    assert metrics["asyncrl/mismatch/kl"] == 0.0 and alarms == []


def test_rows_from_other_versions_are_drift_in_bypass_mode_even_at_equal_weights() -> None:
    model = _peaked_model()
    metrics, alarms = _train_and_check(copy.deepcopy(model), copy.deepcopy(model).to(torch.bfloat16), version=1)
    assert alarms == [] and metrics["asyncrl/mismatch/rows"] == 0 and metrics["asyncrl/mismatch/drift_rows"] == 24


def test_what_other_ranks_saw_is_merged() -> None:
    model = _peaked_model()
    batch = _rollout_batch(copy.deepcopy(model).to(torch.bfloat16))
    halves = [batch.select(slice(0, 12)), batch.select(slice(12, 24))]
    observers = [LogRatioObserver(build_loss_fn(TRAINER, RC)) for _ in halves]
    for half, obs in zip(halves, observers):
        TorchTrainerBackend(copy.deepcopy(model), optim_cfg={"lr": 1e-2}, micro_batch_size=8).train_step(half, obs)
    observers[0].extend([observers[1].drain()])
    observers[0].take()
    metrics, alarms = mismatch_check(batch, observers[0], RC, version=0, weights_moved=False)
    assert metrics["asyncrl/mismatch/rows"] == 24 and alarms
