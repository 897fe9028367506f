"""The context-parallel sequence split (CUDA + TE only at run time; the index arithmetic is checked here):
the 2·cp load-balanced chunks of Megatron's `get_batch_on_this_cp_rank`, and the map from response positions
to each CP rank's local logits."""

from __future__ import annotations

import pytest
import torch

from engine.trainer.megatron.context_parallel import chunk_positions, local_response_index

pytestmark = pytest.mark.megatron


def _megatron_split(val: torch.Tensor, cp: int, rank: int) -> torch.Tensor:
    """The body of megatron.core.utils.get_batch_on_this_cp_rank for one [b, S] tensor (seq_dim 1)."""
    val = val.view(val.shape[0], 2 * cp, val.shape[1] // (2 * cp))
    val = val.index_select(1, torch.tensor([rank, 2 * cp - rank - 1]))
    return val.reshape(val.shape[0], -1)


@pytest.mark.parametrize("cp", [2, 4])
def test_chunks_match_megatron_and_cover_the_sequence_once(cp: int) -> None:
    seq = 8 * cp
    tokens = torch.arange(3 * seq).view(3, seq)
    held = []
    for rank in range(cp):
        pos = chunk_positions(seq, cp, rank)
        assert torch.equal(tokens[:, pos], _megatron_split(tokens, cp, rank))
        held.append(pos)
    assert torch.equal(torch.sort(torch.cat(held)).values, torch.arange(seq))


def test_each_response_position_is_owned_by_exactly_one_rank_at_its_local_index() -> None:
    cp, seq = 2, 16
    tokens = torch.randint(0, 100, (2, seq))
    index = torch.tensor([[3, 4, 5, 6, 7, 8], [9, 10, 11, 12, 13, 14]])
    owners = torch.zeros_like(index)
    for rank in range(cp):
        local, owned = local_response_index(index, seq, cp, rank)
        mine = tokens[:, chunk_positions(seq, cp, rank)]
        assert torch.equal(mine.gather(1, local)[owned], tokens.gather(1, index)[owned])
        owners += owned.long()
    assert torch.equal(owners, torch.ones_like(index))


def test_a_sequence_not_divisible_by_two_cp_is_refused() -> None:
    with pytest.raises(ValueError, match="multiple of 2·cp"):
        chunk_positions(6, 2, 0)
