"""Trainer checkpoints: save → load restores weights, optimizer, step, lr and RNG exactly; writes are atomic."""

from __future__ import annotations

import copy
import json

import torch
from safetensors.torch import load_file
from trainer_helpers import random_batch, token_mean_pg_loss

from engine.trainer.torch_trainer import TorchTrainerBackend


def trainer_for(model: torch.nn.Module) -> TorchTrainerBackend:
    return TorchTrainerBackend(model, optim_cfg={"lr": 1e-2, "warmup_steps": 4}, grad_clip=1.0, micro_batch_size=4)


def test_save_load_round_trip_is_identical(tiny_lm, tmp_path) -> None:
    a = trainer_for(tiny_lm(seed=0))
    for step in range(2):
        a.train_step(random_batch(seed=step), token_mean_pg_loss)
    a.set_lr(5e-3)
    path = tmp_path / "ckpt"
    a.save(str(path))
    after_save = torch.rand(4)

    b = trainer_for(tiny_lm(seed=123))
    b.load(str(path))
    assert torch.equal(torch.rand(4), after_save)  # RNG restored to the state at save time
    assert b.global_step == 2 and b.base_lr == 5e-3
    for (name, pa), (_, pb) in zip(a.model.named_parameters(), b.model.named_parameters()):
        assert torch.equal(pa, pb), name
    sa, sb = a.optimizer.state_dict()["state"], b.optimizer.state_dict()["state"]
    assert sa.keys() == sb.keys()
    for k in sa:
        for field in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(sa[k][field], sb[k][field])
    ma = a.train_step(random_batch(seed=7), token_mean_pg_loss)
    mb = b.train_step(random_batch(seed=7), token_mean_pg_loss)
    assert ma["actor/lr"] == mb["actor/lr"] and ma["actor/grad_norm"] == mb["actor/grad_norm"]
    for pa, pb in zip(a.model.parameters(), b.model.parameters()):
        assert torch.equal(pa, pb)


def test_checkpoint_layout_and_atomic_replace(tiny_lm, tmp_path) -> None:
    trainer = trainer_for(tiny_lm())
    path = tmp_path / "ckpt"
    trainer.save(str(path))
    trainer.train_step(random_batch(), token_mean_pg_loss)
    trainer.save(str(path))  # replaces the previous checkpoint
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
    assert sorted(p.name for p in path.iterdir()) == ["model.safetensors", "optimizer.pt", "rng_rank0.pt",
                                                       "trainer_state.json"]
    weights = load_file(str(path / "model.safetensors"))
    assert "lm_head.weight" not in weights  # tied alias stored once
    assert torch.equal(weights["model.embed_tokens.weight"], trainer.model.lm_head.weight.detach())
    assert json.loads((path / "trainer_state.json").read_text())["global_step"] == 1


def test_loading_into_a_fresh_copy_keeps_tied_weights_tied(tiny_lm, tmp_path) -> None:
    a = trainer_for(tiny_lm())
    a.train_step(random_batch(), token_mean_pg_loss)
    a.save(str(tmp_path / "c"))
    b = trainer_for(copy.deepcopy(tiny_lm(seed=5)))
    b.load(str(tmp_path / "c"))
    assert b.model.lm_head.weight is b.model.model.embed_tokens.weight
    assert torch.equal(b.model.lm_head.weight, a.model.lm_head.weight)
