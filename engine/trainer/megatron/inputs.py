"""A `TrainBatch` in the form Megatron's `GPTModel.forward` takes: left padding removed.

Megatron's RoPE uses positions 0 … S − 1 for every row (it ignores `position_ids`), while HF rows are
left-padded with `position_ids = cumsum(attention_mask) − 1`. Shifting each row left by its number of
leading pad tokens k_b makes the two agree exactly: token j of the real sequence sits at index j with
position j. Then

    tokens[b, j]   = input_ids[b, j + k_b]          (0 past the end)
    masked[b, i, j] = j > i  or  token j is padding   (True = not attended; Megatron's convention)
    logits predicting response token t of row b sit at index P − 1 − k_b + t

The sequence is padded to a multiple of TP (sequence parallelism splits it across TP ranks). Rows must
hold one contiguous run of real tokens (what `engine.trainer.batch.collate` builds). `pad_to` appends
all-padding rows and columns, for collectives that need the same [B, S] on every rank (Megatron's
all-gather MoE token dispatcher).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.trainer.base import TrainBatch


@dataclass
class MegatronInputs:
    """Left-aligned rows; `position_ids` and the causal + padding `attention_mask` are derived on demand."""

    tokens: torch.Tensor  # [B, S] long
    valid: torch.Tensor  # [B, S] bool: a real token
    response_index: torch.Tensor  # [B, R] long: sequence index of the logits predicting each response token

    @property
    def shape(self) -> tuple[int, int]:
        return int(self.tokens.shape[0]), int(self.tokens.shape[1])

    @property
    def position_ids(self) -> torch.Tensor:
        n, seq = self.shape
        return torch.arange(seq, device=self.tokens.device)[None, :].expand(n, seq)

    @property
    def attention_mask(self) -> torch.Tensor:
        """[B, 1, S, S] bool, True = masked: causal, and padding keys."""
        seq = self.shape[1]
        causal = torch.triu(torch.ones(seq, seq, dtype=torch.bool, device=self.tokens.device), diagonal=1)
        return causal[None, None] | ~self.valid[:, None, None, :]

    def to(self, device: torch.device | str) -> MegatronInputs:
        return MegatronInputs(self.tokens.to(device), self.valid.to(device), self.response_index.to(device))

    def pad_to(self, rows: int, seq: int) -> MegatronInputs:
        """Append padding rows/columns up to [rows, seq] (real rows and their indices are unchanged)."""
        n, s = self.shape
        if (rows, seq) == (n, s):
            return self
        if rows < n or seq < s:
            raise ValueError(f"cannot pad [{n}, {s}] down to [{rows}, {seq}]")
        tokens = self.tokens.new_zeros((rows, seq))
        tokens[:n, :s] = self.tokens
        valid = self.valid.new_zeros((rows, seq))
        valid[:n, :s] = self.valid
        index = self.response_index.new_zeros((rows, self.response_index.shape[1]))
        index[:n] = self.response_index
        return MegatronInputs(tokens, valid, index)


def pack_batch(batch: TrainBatch, multiple_of: int = 1) -> MegatronInputs:
    """Left-align every row of `batch` (see the module docstring); S is padded to `multiple_of`."""
    real = batch.attention_mask.bool()
    n, length = real.shape
    width = batch.responses.shape[1]
    zero = torch.zeros(n, dtype=torch.long, device=real.device)
    lead = torch.where(real.any(dim=1), real.int().argmax(dim=1), zero)
    count = real.sum(dim=1)
    cols = torch.arange(length, device=real.device)
    expected = (cols[None, :] >= lead[:, None]) & (cols[None, :] < (lead + count)[:, None])
    if not torch.equal(expected, real):
        raise ValueError("attention_mask rows must hold one contiguous run of real tokens")
    seq = int(max(int(count.max()), 1))
    seq = -(-seq // multiple_of) * multiple_of
    src = torch.arange(seq, device=real.device)[None, :] + lead[:, None]
    inside = src < length
    tokens = torch.where(inside, batch.input_ids.gather(1, src.clamp(max=length - 1)), torch.zeros_like(src))
    valid = inside & torch.arange(seq, device=real.device)[None, :].lt(count[:, None])
    tokens = torch.where(valid, tokens, torch.zeros_like(tokens))
    index = (batch.prompt_len - 1 - lead)[:, None] + torch.arange(width, device=real.device)[None, :]
    return MegatronInputs(tokens=tokens, valid=valid, response_index=index.clamp(0, seq - 1))
