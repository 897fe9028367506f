"""A `TrainBatch` in the form Megatron's `GPTModel.forward` takes: left padding removed.

Megatron's RoPE uses positions 0 … S − 1 for every row (it ignores `position_ids`), while HF rows are
left-padded with `position_ids = cumsum(attention_mask) − 1`. Shifting each row left by its number of
leading pad tokens k_b makes the two agree exactly: token j of the real sequence sits at index j with
position j. Then

    tokens[b, j]   = input_ids[b, j + k_b]          (0 past the end)
    masked[b, i, j] = j > i  or  token j is padding   (True = not attended; Megatron's convention)
    logits predicting response token t of row b sit at index P − 1 − k_b + t

The sequence is padded to a multiple of TP (sequence parallelism splits it across TP ranks). Rows must
hold one contiguous run of real tokens (what `engine.trainer.batch.collate` builds).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.trainer.base import TrainBatch


@dataclass
class MegatronInputs:
    tokens: torch.Tensor  # [B, S] long
    position_ids: torch.Tensor  # [B, S] long
    attention_mask: torch.Tensor  # [B, 1, S, S] bool, True = masked
    response_index: torch.Tensor  # [B, R] long: sequence index of the logits predicting each response token

    def to(self, device: torch.device | str) -> "MegatronInputs":
        return MegatronInputs(self.tokens.to(device), self.position_ids.to(device),
                              self.attention_mask.to(device), self.response_index.to(device))


def pack_batch(batch: TrainBatch, multiple_of: int = 1) -> MegatronInputs:
    """Left-align every row of `batch` (see the module docstring); S is padded to `multiple_of`."""
    real = batch.attention_mask.bool()
    n, length = real.shape
    width = batch.responses.shape[1]
    lead = torch.where(real.any(dim=1), real.int().argmax(dim=1), torch.zeros(n, dtype=torch.long))
    count = real.sum(dim=1)
    cols = torch.arange(length)
    expected = (cols[None, :] >= lead[:, None]) & (cols[None, :] < (lead + count)[:, None])
    if not torch.equal(expected, real):
        raise ValueError("attention_mask rows must hold one contiguous run of real tokens")
    seq = int(max(int(count.max()), 1))
    seq = -(-seq // multiple_of) * multiple_of
    src = torch.arange(seq)[None, :] + lead[:, None]
    inside = src < length
    tokens = torch.where(inside, batch.input_ids.gather(1, src.clamp(max=length - 1)), torch.zeros_like(src))
    valid = inside & torch.arange(seq)[None, :].lt(count[:, None])
    tokens = torch.where(valid, tokens, torch.zeros_like(tokens))
    causal = torch.triu(torch.ones(seq, seq, dtype=torch.bool), diagonal=1)
    mask = causal[None, None] | ~valid[:, None, None, :]
    index = (batch.prompt_len - 1 - lead)[:, None] + torch.arange(width)[None, :]
    return MegatronInputs(
        tokens=tokens,
        position_ids=torch.arange(seq)[None, :].expand(n, seq).contiguous(),
        attention_mask=mask,
        response_index=index.clamp(0, seq - 1),
    )
