"""verl's actor loop: `require_batches × ppo_epochs` optimizer steps per local step, against a hand-written loop."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from trainer_helpers import random_batch, token_mean_pg_loss

from engine.trainer.logprobs import response_log_probs
from engine.trainer.minibatch import combine_update_metrics, mini_batch_plan
from engine.trainer.torch_trainer import TorchTrainerBackend

ROOT = Path(__file__).resolve().parents[2]


def test_plan_splits_every_row_once_per_epoch_in_verl_order() -> None:
    plan = mini_batch_plan(10, 2, 2)
    assert plan == [[[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]] * 2  # verl's default: no shuffle, consecutive chunks
    assert mini_batch_plan(5, 3) == [[[0, 1], [2, 3], [4]]]
    assert mini_batch_plan(1, 3) == [[[0], [], []]]  # the count of optimizer steps never changes


def test_shuffled_plan_is_a_seeded_permutation_per_epoch() -> None:
    plan = mini_batch_plan(32, 4, 3, shuffle=True, seed=7, step=5)
    for epoch in plan:
        assert sorted(i for mini in epoch for i in mini) == list(range(32))
        assert [len(m) for m in epoch] == [8, 8, 8, 8]
    assert plan[0] != plan[1]  # a new permutation each epoch
    assert plan == mini_batch_plan(32, 4, 3, shuffle=True, seed=7, step=5)  # reproducible (resume)
    assert plan != mini_batch_plan(32, 4, 3, shuffle=True, seed=8, step=5)


def test_combined_metrics_average_the_updates_and_count_applied_steps() -> None:
    out = combine_update_metrics([
        {"actor/pg_loss": 1.0, "actor/grad_norm": 2.0, "actor/lr": 0.1, "actor/skipped_step": 0.0},
        {"actor/pg_loss": 3.0, "actor/grad_norm": 4.0, "actor/lr": 0.2, "actor/skipped_step": 1.0},
    ])
    assert out["actor/pg_loss"] == 2.0 and out["actor/grad_norm"] == 3.0 and out["actor/lr"] == 0.2
    assert out["asyncrl/trainer/optimizer_steps"] == 1.0 and out["actor/skipped_step"] == 1.0


def _manual_updates(model: torch.nn.Module, batch, minis: list[list[int]], lr: float, warmup: int) -> list[float]:
    """The reference: plain AdamW, one step per mini-batch (whole mini-batch in one forward), warmup by step."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    lrs = []
    for t, idx in enumerate(minis):
        mb = batch.select(torch.tensor(idx))
        lp, _ = response_log_probs(model, mb.input_ids, mb.attention_mask, mb.position_ids, mb.responses, 1.0, False)
        loss, _ = token_mean_pg_loss(lp * mb.response_mask, None, mb)
        opt.zero_grad()
        loss.backward()
        step_lr = lr * min(1.0, (t + 1) / warmup)
        for g in opt.param_groups:
            g["lr"] = step_lr
        opt.step()
        lrs.append(step_lr)
    return lrs


def test_two_mini_batches_two_epochs_equal_the_hand_written_loop(tiny_lm) -> None:
    batch = random_batch(rows=10, seed=3)
    model = tiny_lm()
    reference = copy.deepcopy(model)
    trainer = TorchTrainerBackend(copy.deepcopy(model), optim_cfg={"lr": 1e-2, "weight_decay": 0.0, "warmup_steps": 3},
                                  grad_clip=1e6, micro_batch_size=3, mini_batches=2, ppo_epochs=2, entropy="none")
    metrics = trainer.train_step(batch, token_mean_pg_loss)
    # by hand: rows 0-4 then 5-9, twice; one AdamW step each, lr warming up over the 4 optimizer steps
    lrs = _manual_updates(reference, batch, [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]] * 2, lr=1e-2, warmup=3)
    assert metrics["asyncrl/trainer/optimizer_steps"] == 4 and trainer.global_step == 4
    assert metrics["actor/lr"] == pytest.approx(lrs[-1]) and metrics["actor/micro_batches"] == 8
    ref_params = dict(reference.named_parameters())
    for name, p in trainer.model.named_parameters():
        torch.testing.assert_close(p, ref_params[name], atol=1e-4, rtol=1e-3)


def test_one_step_over_everything_is_not_the_same_update(tiny_lm) -> None:
    """Negative control: the old behaviour (one optimizer step per local step) lands elsewhere."""
    batch = random_batch(rows=10, seed=3)
    model = tiny_lm()
    verl_like = TorchTrainerBackend(copy.deepcopy(model), optim_cfg={"lr": 1e-2, "weight_decay": 0.0},
                                    grad_clip=1e6, micro_batch_size=3, mini_batches=2, ppo_epochs=2, entropy="none")
    single = TorchTrainerBackend(copy.deepcopy(model), optim_cfg={"lr": 1e-2, "weight_decay": 0.0},
                                 grad_clip=1e6, micro_batch_size=3, entropy="none")
    verl_like.train_step(batch, token_mean_pg_loss)
    single.train_step(batch, token_mean_pg_loss)
    diff = max(float((a - b).detach().abs().max()) for a, b in zip(verl_like.model.parameters(), single.model.parameters()))
    assert diff > 1e-2 and single.global_step == 1


def test_micro_batches_see_their_epoch_and_whether_the_weights_moved(tiny_lm) -> None:
    seen: list[tuple[int, bool, int]] = []

    def loss(lp, ent, mb):
        seen.append((mb.meta["ppo_epoch"], mb.meta["fresh"], len(mb)))
        return token_mean_pg_loss(lp, ent, mb)

    trainer = TorchTrainerBackend(tiny_lm(), optim_cfg={"lr": 1e-3}, micro_batch_size=8, mini_batches=2, ppo_epochs=2)
    trainer.train_step(random_batch(rows=10), loss)
    assert seen == [(0, True, 5), (0, False, 5), (1, False, 5), (1, False, 5)]


def test_the_7b_dapo_preset_takes_four_optimizer_steps_per_local_step() -> None:
    from asyncrl_cli.config.loader import analyze_run_config

    an = analyze_run_config(ROOT / "presets/runs/qwen2.5-math-7b-dapo-fsdp2-64-64.toml")
    assert an.config is not None and an.derived is not None
    assert an.derived.optimizer_steps_per_local_step == 4
    assert an.config.async_training.require_batches == 4 and an.config.trainer.ppo_epochs == 1
