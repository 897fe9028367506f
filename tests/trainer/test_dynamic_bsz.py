"""Token-budget micro-batches (`use_dynamic_bsz`, verl's `rearrange_micro_batches`): the partition fits the budget
and balances tokens, and the trainer's gradient — hence the weights after two updates — equals the unsplit
path's for every `loss_agg_mode`, on 1 and 2 ranks."""

from __future__ import annotations

import random

import pytest
import torch
from dynamic_bsz_worker import BUDGET, ROWS, run_rank
from fsdp_worker import OPTIM
from trainer_helpers import agg_loss_fn, build_tiny_lm, random_batch, spawn_ranks

from engine.trainer.batch import row_lengths
from engine.trainer.minibatch import balanced_partitions, micro_batch_count, padded_tokens, token_budget_micro_batches
from engine.trainer.torch_trainer import TorchTrainerBackend


@pytest.mark.parametrize("seed", range(5))
def test_token_budget_groups_cover_every_row_once_within_the_budget(seed: int) -> None:
    rng = random.Random(seed)
    lengths = [rng.randint(1, 400) for _ in range(rng.randint(1, 60))]
    budget = rng.randint(max(lengths), 2000)
    count = micro_batch_count(lengths, budget)
    groups = token_budget_micro_batches(lengths, count)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    assert all(padded_tokens(lengths, g) <= budget for g in groups)  # padded to the longest row: still fits
    assert count >= -(-sum(lengths) // budget)  # never fewer than verl's ⌈Σℓ / budget⌉
    assert all(g == sorted(g) for g in groups)
    more = token_budget_micro_batches(lengths, count + 3)  # the ranks agreed on a larger count
    assert len(more) == min(count + 3, len(lengths)) and all(padded_tokens(lengths, g) <= budget for g in more)
    assert sorted(i for g in more for i in g) == list(range(len(lengths)))


def test_the_budget_counts_the_padding_of_each_micro_batch() -> None:
    """One long row among short ones: summing real tokens would put all four in one micro-batch that the
    forward pads to 4 × 1000 = 4000 tokens against a budget of 1300."""
    lengths = [100, 1000, 100, 100]
    count = micro_batch_count(lengths, 1300)
    groups = token_budget_micro_batches(lengths, count)
    assert count == 2 and sorted(map(sorted, groups)) == [[0, 2, 3], [1]]
    assert [padded_tokens(lengths, g) for g in groups] == [1000, 300]


def test_balanced_partitions_balance_tokens_and_equal_sizes() -> None:
    lengths = [300, 290, 10, 20, 150, 160, 5, 305]
    sums = [sum(lengths[i] for i in g) for g in balanced_partitions(lengths, 2)]
    assert max(sums) - min(sums) <= 10
    equal = balanced_partitions(lengths, 4, equal_size=True)
    assert [len(g) for g in equal] == [2, 2, 2, 2]
    sums = [sum(lengths[i] for i in g) for g in equal]
    assert max(sums) - min(sums) <= 40


def _trainer(**kw) -> TorchTrainerBackend:
    return TorchTrainerBackend(build_tiny_lm(seed=0), optim_cfg=OPTIM, grad_clip=1e6, **kw)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_token_budget_updates_equal_the_unsplit_ones(mode: str) -> None:
    batch = random_batch(rows=ROWS, seed=3, max_prompt=9, max_response=9)
    plain, dynamic = _trainer(micro_batch_size=ROWS, mini_batches=2), _trainer(
        mini_batches=2, use_dynamic_bsz=True, ppo_max_token_len_per_gpu=BUDGET)
    for _ in range(2):
        plain.train_step(batch, agg_loss_fn(batch, mode))
        metrics = dynamic.train_step(batch, agg_loss_fn(batch, mode))
    assert metrics["asyncrl/trainer/micro_batches"] > 2  # more than one micro-batch per mini-batch
    assert dynamic.global_step == plain.global_step == 4
    # 4 Adam steps at lr 1e-3 summed in another order: isolated elements differ by ~1.4e-6 (measured); 1e-5 = 1 %
    # of one step still fails a wrongly weighted micro-batch, which moves every weight by ~lr.
    for (name, a), b in zip(plain.model.state_dict().items(), dynamic.model.state_dict().values()):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5, msg=name)


def test_token_budget_log_probs_come_back_in_row_order() -> None:
    batch = random_batch(rows=ROWS, seed=3, max_prompt=9, max_response=9)
    plain = _trainer(micro_batch_size=1).compute_log_probs(batch, with_entropy=True)
    dynamic = _trainer(use_dynamic_bsz=True, log_prob_max_token_len_per_gpu=max(row_lengths(batch)))
    got = dynamic.compute_log_probs(batch, with_entropy=True)
    for a, b in zip(plain, got):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-5)


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_two_ranks_with_token_budgets_equal_the_single_unsplit_process(tmp_path) -> None:
    ranks = spawn_ranks(run_rank, 2, tmp_path)
    batch = random_batch(rows=ROWS, seed=3, max_prompt=9, max_response=9)
    single = _trainer(micro_batch_size=ROWS)
    half = ROWS // 2
    # rank 0 holds rows 0-4, rank 1 rows 5-9; each splits its rows into 2 mini-batches (3 + 2 rows)
    for _ in range(2):
        for rows in ([0, 1, 2, 5, 6, 7], [3, 4, 8, 9]):
            sub = batch.select(torch.tensor(rows))
            single.train_step(sub, agg_loss_fn(sub, "seq-mean-token-sum"))
    assert ranks[0]["metrics"][0]["asyncrl/trainer/micro_batches"] >= 2
    for name, tensor in single.model.state_dict().items():
        torch.testing.assert_close(ranks[0]["final"][name], tensor, atol=1e-5, rtol=1e-4, msg=name)
    plain_lp, _ = _trainer(micro_batch_size=ROWS).compute_log_probs(batch)
    torch.testing.assert_close(torch.cat([ranks[0]["log_probs"], ranks[1]["log_probs"]]), plain_lp,
                               atol=1e-6, rtol=1e-5)
    assert half == len(ranks[0]["log_probs"])
