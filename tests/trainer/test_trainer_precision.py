"""`trainer.precision = "bf16"`: autocast compute over fp32 master weights — the weights, gradients and AdamW
state stay fp32, the log-probs stay close to fp32's, and the update still moves the policy the right way."""

from __future__ import annotations

import copy

import pytest
import torch
from trainer_helpers import random_batch, token_mean_pg_loss

from engine.trainer.torch_trainer import TorchTrainerBackend


def make(model: torch.nn.Module, precision: str) -> TorchTrainerBackend:
    return TorchTrainerBackend(model, optim_cfg={"lr": 1e-3, "weight_decay": 0.0}, grad_clip=1e6,
                               micro_batch_size=4, precision=precision)


def test_bf16_keeps_fp32_master_weights_grads_and_optimizer_state(tiny_lm) -> None:
    trainer = make(tiny_lm(), "bf16")
    grads: dict[str, torch.dtype] = {}
    for name, p in trainer.model.named_parameters():
        p.register_post_accumulate_grad_hook(lambda param, name=name: grads.__setitem__(name, param.grad.dtype))
    metrics = trainer.train_step(random_batch(rows=8), token_mean_pg_loss)
    assert metrics["actor/skipped_step"] == 0
    assert {p.dtype for p in trainer.model.parameters()} == {torch.float32}
    assert grads and set(grads.values()) == {torch.float32}
    states = [s for s in trainer.optimizer.state.values() if "exp_avg" in s]
    assert states and {s["exp_avg"].dtype for s in states} == {torch.float32}


def test_bf16_log_probs_are_fp32_and_close_to_fp32_but_not_identical(tiny_lm) -> None:
    model = tiny_lm()
    batch = random_batch(rows=8)
    lp32, _ = make(copy.deepcopy(model), "fp32").compute_log_probs(batch)
    lp16, _ = make(copy.deepcopy(model), "bf16").compute_log_probs(batch)
    assert lp16.dtype == torch.float32
    mask = batch.response_mask.bool()
    diff = (lp16 - lp32)[mask].abs()
    assert float(diff.max()) < 0.1  # bf16 has 8 mantissa bits: log-probs agree to a few 1e-2
    assert float(diff.max()) > 0.0  # and the matmuls really ran in bf16


def test_bf16_update_raises_log_prob_of_positive_advantage_tokens(tiny_lm) -> None:
    batch = random_batch(rows=8)
    batch.advantages = batch.response_mask.clone()  # every token rewarded: its log-prob must rise
    trainer = make(tiny_lm(), "bf16")
    before, _ = trainer.compute_log_probs(batch)
    for _ in range(3):
        trainer.train_step(batch, token_mean_pg_loss)
    after, _ = trainer.compute_log_probs(batch)
    mask = batch.response_mask.bool()
    assert float((after - before)[mask].mean()) > 0.05


def test_unknown_precision_is_refused(tiny_lm) -> None:
    with pytest.raises(ValueError, match="precision"):
        make(tiny_lm(), "fp8")
