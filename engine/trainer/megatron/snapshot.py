"""The proximal-policy snapshot of decoupled rollout correction: a host copy of every parameter.

At each weight sync the live parameters θ_v are copied into host buffers (pinned when CUDA is available,
so the copies are DMA transfers). To evaluate π_prox the live values are first stashed into a second host
buffer set, the snapshot is copied in, the forward runs, and the stash is copied back: `copy_` between
equal dtypes is exact, so the live weights are restored bit for bit. Both buffer sets are allocated once
and reused ("consistently pinned"), so repeated syncs never re-pin memory.

What is copied: for a Megatron DDP model, the contiguous `param_data` of each dense and each
expert-parallel buffer when the buffer owns one (distributed optimizer), otherwise each parameter the
buffer holds; parameters outside any DDP buffer are copied individually. `targets` checks that every
parameter of the model is covered exactly once.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch


def snapshot_targets(ddp_model: torch.nn.Module) -> list[torch.Tensor]:
    """The live tensors that hold all parameters of a Megatron DDP model (dense + expert-parallel buffers)."""
    targets: list[torch.Tensor] = []
    covered: set[int] = set()
    for buffer in list(getattr(ddp_model, "buffers", [])) + list(getattr(ddp_model, "expert_parallel_buffers", [])):
        if getattr(buffer, "param_data", None) is not None:
            targets.append(buffer.param_data)
            covered.update(id(p) for p in buffer.params)
        else:
            for p in buffer.params:
                targets.append(p.data)
                covered.add(id(p))
    for p in ddp_model.parameters():
        if id(p) not in covered:
            targets.append(p.data)
            covered.add(id(p))
    return targets


def _host_like(t: torch.Tensor, pin: bool) -> torch.Tensor:
    return torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=pin)


class ParamSnapshot:
    """Host copies of a fixed list of live tensors, with an exact swap-in / swap-back."""

    def __init__(self, live: list[torch.Tensor], pin: bool | None = None) -> None:
        self.live = live
        self.pin = torch.cuda.is_available() if pin is None else pin
        self._snap: list[torch.Tensor] | None = None
        self._stash: list[torch.Tensor] | None = None
        self._spare: list[torch.Tensor] | None = None
        self.version = 0
        self.stats: dict[str, float] = {}

    @property
    def taken(self) -> bool:
        return self._snap is not None

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.live)

    def _copy(self, dst: list[torch.Tensor], src: list[torch.Tensor]) -> None:
        for d, s in zip(dst, src):
            d.copy_(s, non_blocking=self.pin)
        if self.pin:
            torch.cuda.synchronize()

    @torch.no_grad()
    def take(self) -> float:
        """Copy the live tensors into the snapshot; returns the seconds spent."""
        t0 = time.perf_counter()
        if self._snap is None:
            self._snap = self._spare or [_host_like(t, self.pin) for t in self.live]
        self._copy(self._snap, self.live)
        self.version += 1
        seconds = time.perf_counter() - t0
        self.stats["snapshot_s"] = seconds
        return seconds

    def swap(self, to_snapshot: bool) -> None:
        """`to_snapshot`: stash the live tensors and copy the snapshot in; else copy the stash back (exact)."""
        if to_snapshot and self._snap is None:
            raise RuntimeError("no parameter snapshot: call snapshot_params() first")
        with torch.no_grad():
            t0 = time.perf_counter()
            if to_snapshot:
                if self._stash is None:
                    self._stash = [_host_like(t, self.pin) for t in self.live]
                self._copy(self._stash, self.live)
                self._copy(self.live, self._snap)
            else:
                self._copy(self.live, self._stash)
            self.stats["swap_in_s" if to_snapshot else "swap_back_s"] = time.perf_counter() - t0

    @contextmanager
    def swapped_in(self) -> Iterator[None]:
        """Inside the block the live tensors hold the snapshot; afterwards their own values, bit-exactly."""
        self.swap(True)
        try:
            yield
        finally:
            self.swap(False)

    def clear(self) -> None:
        """Forget the snapshot (the host buffers are kept for reuse)."""
        if self._snap is not None:
            self._spare = self._snap
        self._snap = None

    def state(self) -> list[torch.Tensor] | None:
        """The snapshot tensors (for checkpointing), or None if none was taken."""
        return self._snap

    @torch.no_grad()
    def restore_state(self, tensors: list[torch.Tensor]) -> None:
        """Load snapshot tensors saved by `state()` (shapes and dtypes must match the live tensors)."""
        if len(tensors) != len(self.live) or any(
                a.shape != b.shape or a.dtype != b.dtype for a, b in zip(tensors, self.live)):
            raise ValueError("saved proximal snapshot does not match this model's parameters")
        if self._snap is None:
            self._snap = self._spare or [_host_like(t, self.pin) for t in self.live]
        for d, s in zip(self._snap, tensors):
            d.copy_(s)


class VersionWeights:
    """The resume's methods over the backend's `snapshot` (a `ParamSnapshot`), which is the version's weights θ_v
    (taken at each sync): `engine.runtime.trainer_actor` swaps it in to push θ_v to the replicas on a resume
    between two syncs. `save` / `load` (`checkpointing.py`) already write and restore it (`prox_rank{r}.pt`)."""

    snapshot: ParamSnapshot

    def snapshot_swap(self, to_snapshot: bool) -> None:
        """Swap the snapshot into the parameters (True) or the live values back, bit-exactly (False)."""
        self.snapshot.swap(to_snapshot)

    def save_version(self, path: str) -> None:
        """Nothing more to write: `save` writes the snapshot whenever one is taken."""

    def load_version(self, path: str) -> bool:
        """Whether `load` restored a snapshot from the checkpoint `path` (its `prox_rank{r}.pt`)."""
        return self.snapshot.taken
