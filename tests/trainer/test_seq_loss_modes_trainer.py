"""GSPO / GMPO through the real path: `prepare_batch` (micro-batch weights) → `TorchTrainerBackend.train_step`
with `build_loss_fn`: micro-batched steps give the whole mini-batch's gradient whatever `loss_agg_mode` says."""

from __future__ import annotations

import copy

import pytest
import torch
from trainer_helpers import EOS, PAD

from engine.algo.batching import prepare_batch
from engine.plan.role_parts import batch_prep_spec
from engine.algo.loss import build_loss_fn
from engine.algo.policy_loss import agg_denominator
from engine.config.schema import RunConfig
from engine.trainer.torch_trainer import TorchTrainerBackend
from engine.types import Prompt, Trajectory, TrajectoryGroup


def groups(seed: int = 0) -> list[TrajectoryGroup]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for g in range(3):
        prompt = Prompt(uid=f"0:{g}", index=g, epoch=0, prompt_ids=torch.randint(2, 32, (4 + 2 * g,), generator=gen).tolist())
        trajs = []
        for i in range(4):
            n = 1 if i == 0 else int(torch.randint(2, 8, (1,), generator=gen))
            ids = torch.randint(2, 32, (n,), generator=gen).tolist()
            ids[-1] = EOS if i % 2 else ids[-1]
            lps = (-3.4 + 0.3 * torch.randn(n, generator=gen)).tolist()
            trajs.append(Trajectory(ids, lps, "stop", 0, 0, reward=float(torch.rand(1, generator=gen))))
        out.append(TrajectoryGroup(prompt, trajs))
    return out


def grads_of(model: torch.nn.Module, micro: int, batch, loss_fn) -> dict[str, torch.Tensor]:
    trainer = TorchTrainerBackend(model, optim_cfg={"lr": 1e-3, "weight_decay": 0.0}, grad_clip=1e6,
                                  micro_batch_size=micro)
    grads: dict[str, torch.Tensor] = {}
    for name, p in trainer.model.named_parameters():
        p.register_post_accumulate_grad_hook(lambda param, name=name: grads.__setitem__(name, param.grad.clone()))
    trainer.train_step(batch, loss_fn)
    return grads


@pytest.mark.parametrize("loss_mode", ["gspo", "geo_mean"])
def test_micro_batched_sequence_loss_equals_the_whole_batch(tiny_lm, loss_mode: str) -> None:
    cfg = RunConfig.model_validate({"model": {"path": "builtin:tiny-qwen"}, "data": {"train_files": ["builtin:copy"]},
                                    "trainer": {"loss_mode": loss_mode, "loss_agg_mode": "token-mean"}})
    batch = prepare_batch(groups(), batch_prep_spec(cfg), PAD, trainer_version=0).batch
    loss_fn = build_loss_fn(cfg.trainer, cfg.algorithm.rollout_correction)
    model = tiny_lm()
    whole = grads_of(copy.deepcopy(model), 12, batch, loss_fn)
    split = grads_of(copy.deepcopy(model), 5, batch, loss_fn)
    assert whole.keys() == split.keys() and len(whole) > 0
    assert max(float(g.abs().max()) for g in whole.values()) > 1e-4
    for name in whole:
        torch.testing.assert_close(split[name], whole[name], atol=1e-6, rtol=0)
    # negative control: the configured token-mean weights would not give the whole batch's gradient
    batch.meta["micro_weight_fn"] = lambda mb: agg_denominator(mb.response_mask, "token-mean")
    wrong = grads_of(copy.deepcopy(model), 5, batch, loss_fn)
    assert max(float((wrong[n] - whole[n]).abs().max()) for n in whole) > 1e-3
