"""The seam where training backends plug in (`torch` — the embedded default, FSDP2 with >1 rank — and
`megatron`). A backend owns the policy weights and the optimizer of one trainer rank; the algorithm (loss,
advantages, rollout correction) stays in `engine.algo` and is handed in as a function."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch


@dataclass
class TrainBatch:
    """A padded batch of trajectories, `B` rows.

    input_ids = [left-padded prompt (P) | right-padded response (R)], so `input_ids.shape == [B, P + R]`.
    All `[B, R]` tensors are aligned with the response part; `response_mask` is 1 on real response tokens
    (up to and including the first EOS) and 0 on padding.
    """

    input_ids: torch.Tensor  # [B, P+R] long
    attention_mask: torch.Tensor  # [B, P+R] long
    position_ids: torch.Tensor  # [B, P+R] long, cumsum(attention_mask) - 1 (clamped at 0)
    responses: torch.Tensor  # [B, R] long
    response_mask: torch.Tensor  # [B, R] float 0/1
    rollout_log_probs: torch.Tensor  # [B, R] float
    advantages: torch.Tensor | None = None  # [B, R]
    old_log_probs: torch.Tensor | None = None  # [B, R] π_old (π_prox in decoupled mode, π_rollout in bypass)
    ref_log_probs: torch.Tensor | None = None  # [B, R]
    is_weights: torch.Tensor | None = None  # [B, R] rollout-correction IS weights (decoupled mode)
    meta: dict = field(default_factory=dict)

    TENSORS = ("input_ids", "attention_mask", "position_ids", "responses", "response_mask",
               "rollout_log_probs", "advantages", "old_log_probs", "ref_log_probs", "is_weights")
    """The tensor fields, in declaration order (`select` and `to` walk them)."""

    @property
    def prompt_len(self) -> int:
        return self.input_ids.shape[1] - self.responses.shape[1]

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def select(self, idx: torch.Tensor | slice) -> "TrainBatch":
        """Rows `idx` of every tensor; per-row entries of `meta` (lists and tensors as long as the batch) are
        sliced too, the rest is shared."""
        kw = {name: None if (t := getattr(self, name)) is None else t[idx] for name in self.TENSORS}
        rows = range(len(self))[idx] if isinstance(idx, slice) else [int(i) for i in idx]
        meta = {k: ([v[i] for i in rows] if isinstance(v, list) and len(v) == len(self) else
                    v[list(rows)] if isinstance(v, torch.Tensor) and v.dim() and len(v) == len(self) else v)
                for k, v in self.meta.items()}
        return TrainBatch(**kw, meta=meta)

    def to(self, device: torch.device | str) -> "TrainBatch":
        """Every tensor on `device` (`meta` shared)."""
        kw = {name: None if (t := getattr(self, name)) is None else t.to(device) for name in self.TENSORS}
        return TrainBatch(**kw, meta=self.meta)


LossFn = Callable[[torch.Tensor, torch.Tensor | None, TrainBatch], tuple[torch.Tensor, dict[str, float]]]
"""loss_fn(log_probs [b, R], entropy [b, R] or None, micro_batch) -> (scalar loss, metrics)."""


@runtime_checkable
class TrainerBackend(Protocol):
    """Policy weights + optimizer of one trainer rank."""

    def compute_log_probs(self, batch: TrainBatch, *, with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """log π_θ(response token) [B, R] (no grad), at the rollout temperature; entropy [B, R] if asked."""
        ...

    def train_step(self, batch: TrainBatch, loss_fn: LossFn) -> dict[str, float]:
        """One optimizer update over `batch`, split into micro-batches with gradient accumulation, then
        gradient clipping. Returns metrics (`actor/grad_norm`, `actor/lr`, averaged loss metrics ...)."""
        ...

    def snapshot_params(self) -> None:
        """Copy the current parameters to (pinned) CPU memory: the version's weights θ_v, taken at each sync —
        the proximal policy π_prox of decoupled mode, and what a resume between two syncs serves."""
        ...

    def snapshot_swap(self, to_snapshot: bool) -> None:
        """True: the snapshot into the parameters (the live values set aside); False: the live values back,
        bit-exactly."""
        ...

    def save_version(self, path: str) -> None:
        """Write the snapshot into the trainer checkpoint directory `path` (after `save`; a checkpoint taken
        between two syncs)."""
        ...

    def load_version(self, path: str) -> bool:
        """After `load(path)`: restore the snapshot the checkpoint holds; False when it holds none."""
        ...

    def proximal_log_probs(self, batch: TrainBatch) -> torch.Tensor:
        """log π_prox [B, R]: swap the snapshot in, compute log-probs, swap the live weights back bit-exactly."""
        ...

    def export_weights(self, bucket_bytes: int) -> Iterator[dict[str, torch.Tensor]]:
        """The policy weights in HF names and the model's dtype (tied `lm_head.weight` included), in buckets
        of ~bucket_bytes.

        The tensors may be of the live weights: valid until the next optimizer step (the sync copies
        them out at once); copy them to keep them longer."""
        ...

    def save(self, path: str) -> None:
        """Weights + optimizer + RNG states to directory `path`."""
        ...

    def load(self, path: str) -> None:
        ...
