"""MegatronTrainerBackend takes verl's `require_batches × ppo_epochs` optimizer steps per local step."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from megatron_helpers import make_batch, nll_loss

from engine.trainer.megatron.backend import MegatronTrainerBackend

pytestmark = pytest.mark.usefixtures("process_group")


def _backend(hf_dirs: dict[str, Path], **kw: object) -> MegatronTrainerBackend:
    kw = {"optim_cfg": {"lr": 1e-2, "weight_decay": 0.0, "warmup_steps": 3}, "micro_batch_size": 1,
          "temperature": 0.7} | kw
    return MegatronTrainerBackend(str(hf_dirs["qwen3"]), **kw)


def test_two_mini_batches_two_epochs_equal_four_single_updates(hf_dirs: dict[str, Path]) -> None:
    batch = make_batch(rows=4)
    looped = _backend(hf_dirs, mini_batches=2, ppo_epochs=2)
    metrics = looped.train_step(batch, nll_loss)
    assert metrics["asyncrl/trainer/optimizer_steps"] == 4 and looped.global_step == 4
    # by hand: rows 0-1, rows 2-3, twice — each one optimizer update of a one-mini-batch backend
    manual = _backend(hf_dirs)
    lrs = [manual.train_step(batch.select(torch.tensor(rows)), nll_loss)["actor/lr"]
           for rows in ([0, 1], [2, 3], [0, 1], [2, 3])]
    assert lrs == pytest.approx([1e-2 / 3, 2e-2 / 3, 1e-2, 1e-2]) and metrics["actor/lr"] == pytest.approx(lrs[-1])
    ref = dict(manual.model.named_parameters())
    for name, p in looped.model.named_parameters():
        torch.testing.assert_close(p.detach(), ref[name].detach(), atol=1e-6, rtol=0)
    single = _backend(hf_dirs)
    single.train_step(batch, nll_loss)
    assert single.global_step == 1
    assert any(not torch.allclose(p.detach(), ref[n].detach(), atol=1e-4)
               for n, p in single.model.named_parameters())


def test_token_budget_micro_batches_equal_the_unsplit_update(hf_dirs: dict[str, Path]) -> None:
    """`use_dynamic_bsz` on Megatron: token-budget micro-batches (rows 7–9 tokens, a budget of 17 padded tokens →
    micro-batches of 1–2 rows), two updates equal two updates over the whole batch at once, and the log-probs come back in row
    order."""
    batch = make_batch(rows=6)
    plain, dynamic = _backend(hf_dirs, micro_batch_size=6), _backend(
        hf_dirs, use_dynamic_bsz=True, ppo_max_token_len_per_gpu=17, log_prob_max_token_len_per_gpu=9)
    torch.testing.assert_close(dynamic.compute_log_probs(batch)[0], plain.compute_log_probs(batch)[0],
                               atol=1e-6, rtol=1e-5)
    for _ in range(2):
        plain.train_step(batch, nll_loss)
        metrics = dynamic.train_step(batch, nll_loss)
    assert metrics["asyncrl/trainer/micro_batches"] >= 3
    ref = dict(plain.model.named_parameters())
    # summed in another order: isolated elements differ by ~2.3e-6 after 2 Adam steps (measured); a wrongly
    # weighted micro-batch moves every weight by ~lr (3e-3 here), so 1e-5 still fails it
    for name, p in dynamic.model.named_parameters():
        torch.testing.assert_close(p.detach(), ref[name].detach(), atol=1e-5, rtol=1e-5)
