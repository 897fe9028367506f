"""Row sharding for a multi-rank trainer (`engine.trainer.batch.shard_rows`): contiguous shards covering every
row once; with FSDP2 over gloo on 2 processes the concatenated per-shard log-probs are the single-process
log-probs of the whole batch, and a rank with no rows (a filler shard) still takes part in a step."""

from __future__ import annotations

from itertools import chain, pairwise

import pytest
import torch
from shard_worker import MICRO, OPTIM, ROWS, run_shard_rank
from trainer_helpers import build_tiny_lm, random_batch, spawn_ranks, token_mean_pg_loss

from engine.trainer.batch import is_filler, shard_bounds, shard_rows
from engine.trainer.torch_trainer import TorchTrainerBackend

WORLD = 2


@pytest.mark.parametrize("rows", [1, 2, 3, 7, 8, 64])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_shard_bounds_are_contiguous_balanced_and_cover_every_row_once(rows: int, world: int) -> None:
    bounds = shard_bounds(rows, world)
    assert len(bounds) == world and bounds[0][0] == 0 and bounds[-1][1] == rows
    assert all(hi == lo2 for (_, hi), (lo2, _) in pairwise(bounds))  # contiguous, in order
    sizes = [hi - lo for lo, hi in bounds]
    assert sum(sizes) == rows and max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)
    assert (min(sizes) >= 1) == (rows >= world)  # every rank has rows whenever there are enough


def test_shard_rows_selects_the_rows_and_fills_empty_ranks() -> None:
    batch = random_batch(rows=5, seed=1)
    shards = shard_rows(batch, 3)
    assert [len(s) for s in shards] == [2, 2, 1] and not any(is_filler(s) for s in shards)
    assert torch.equal(torch.cat([s.input_ids for s in shards]), batch.input_ids)
    assert list(chain.from_iterable(s.meta["uids"] for s in shards)) == batch.meta["uids"]
    few = shard_rows(random_batch(rows=1, seed=2), 3)
    assert [is_filler(s) for s in few] == [False, True, True] and all(len(s) == 1 for s in few)
    assert "filler" not in few[0].meta  # the original batch's meta is never marked


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_two_rank_shard_log_probs_equal_single_process(tmp_path) -> None:
    ranks = spawn_ranks(run_shard_rank, WORLD, tmp_path)

    single = TorchTrainerBackend(build_tiny_lm(seed=0), optim_cfg=OPTIM, grad_clip=1e6, micro_batch_size=MICRO)
    batch = random_batch(rows=ROWS, seed=4)
    expected, _ = single.compute_log_probs(batch)
    assert [len(r["log_probs"]) for r in ranks] == [4, 3]
    torch.testing.assert_close(torch.cat([r["log_probs"] for r in ranks]), expected, atol=1e-5, rtol=0)

    # one row, two ranks: rank 1 steps through the collectives on a filler shard and contributes nothing
    one = random_batch(rows=1, seed=5)
    assert [r["filler"] for r in ranks] == [False, True]
    assert ranks[1]["one_log_probs"].shape == (0, one.responses.shape[1]) and ranks[1]["one_entropy"].numel() == 0
    torch.testing.assert_close(ranks[0]["one_log_probs"], single.compute_log_probs(one)[0], atol=1e-5, rtol=0)
    reference = single.train_step(one, token_mean_pg_loss)
    for r in ranks:
        assert abs(r["metrics"]["actor/grad_norm"] - reference["actor/grad_norm"]) < 1e-5
        assert abs(r["metrics"]["actor/pg_loss"] - reference["actor/pg_loss"]) < 1e-5
        assert r["metrics"]["actor/response_tokens"] == reference["actor/response_tokens"]
    for name, tensor in single.model.state_dict().items():
        torch.testing.assert_close(ranks[0]["export"][name], tensor, atol=1e-5, rtol=0)


def test_balanced_shards_even_out_tokens_and_log_probs_come_back_in_row_order() -> None:
    """With token budgets the DP shards are equal-sized and token-balanced (verl's `balance_batch`); the group
    puts the leaders' results back in row order."""
    from types import SimpleNamespace

    from engine.runtime.trainer_group import BackendGroup
    from engine.trainer.batch import row_lengths, shard_indices

    batch = random_batch(rows=12, seed=7)
    lengths = row_lengths(batch)
    idx = shard_indices(batch, 3, balance=True)
    assert [len(g) for g in idx] == [4, 4, 4] and sorted(sum(idx, [])) == list(range(12))
    spread = lambda groups: max(sum(lengths[i] for i in g) for g in groups) - min(  # noqa: E731
        sum(lengths[i] for i in g) for g in groups)
    assert spread(idx) <= spread(shard_indices(batch, 3))
    shards = shard_rows(batch, 3, balance=True)
    group = BackendGroup(SimpleNamespace(balance=True, leaders=[0, 1, 2]), None, "policy")
    restored = group._in_row_order(batch, [s.input_ids for s in shards])
    assert torch.equal(restored, batch.input_ids)
    assert shard_indices(random_batch(rows=7, seed=7), 3, balance=True) == [[0, 1, 2], [3, 4], [5, 6]]
