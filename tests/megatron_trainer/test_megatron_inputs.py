"""TrainBatch → Megatron inputs: left padding removed so that Megatron's RoPE positions equal HF's."""

from __future__ import annotations

import pytest
import torch
from megatron_helpers import make_batch

from engine.trainer.megatron.inputs import pack_batch


def test_rows_are_left_aligned_and_positions_match_hf() -> None:
    batch = make_batch(rows=3, prompt=5, response=4)
    packed = pack_batch(batch)
    for r in range(3):
        real = batch.input_ids[r][batch.attention_mask[r].bool()]
        n = real.numel()
        assert torch.equal(packed.tokens[r, :n], real)
        assert packed.valid[r, :n].all() and not packed.valid[r, n:].any()
        hf_positions = batch.position_ids[r][batch.attention_mask[r].bool()]
        assert torch.equal(packed.position_ids[r, :n], hf_positions)


def test_response_index_points_at_the_logits_predicting_each_response_token() -> None:
    batch = make_batch(rows=3, prompt=5, response=4)
    packed = pack_batch(batch)
    for r in range(3):
        for t in range(4):
            if batch.response_mask[r, t]:
                # the token right after the predicting position is the response token itself
                assert packed.tokens[r, packed.response_index[r, t] + 1] == batch.responses[r, t]


def test_mask_is_causal_and_hides_padding_keys() -> None:
    batch = make_batch(rows=2, prompt=5, response=4)
    packed = pack_batch(batch, multiple_of=4)
    mask = packed.attention_mask
    seq = packed.shape[1]
    assert seq % 4 == 0 and mask.shape == (2, 1, seq, seq)
    assert mask[0, 0, 2, 3] and not mask[0, 0, 3, 2]  # future masked, past visible
    assert (~packed.valid[0]).any() and mask[0, 0][:, ~packed.valid[0]].all()  # padding keys hidden from all


def test_pad_to_keeps_real_rows_and_adds_empty_ones() -> None:
    packed = pack_batch(make_batch(rows=2))
    rows, seq = packed.shape
    bigger = packed.pad_to(rows + 1, seq + 3)
    assert bigger.shape == (rows + 1, seq + 3)
    assert torch.equal(bigger.tokens[:rows, :seq], packed.tokens)
    assert not bigger.valid[rows:].any() and not bigger.valid[:, seq:].any()
    with pytest.raises(ValueError):
        bigger.pad_to(rows, seq)


def test_rows_with_holes_are_rejected() -> None:
    batch = make_batch(rows=2)
    batch.attention_mask[0, 3] = 0
    with pytest.raises(ValueError, match="contiguous"):
        pack_batch(batch)
