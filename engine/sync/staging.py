"""Staged weight loads (`rollout.weight_sync_back_buffer`): a replica receives version v into a *back buffer* —
a second copy of its weights — while it is still generating with version v−1, and the new weights go live
at a step boundary by swapping each parameter's storage with its back buffer (O(1) per tensor, no copy).

    stage(buckets)   every bucket copied into the back tensors (`engine.sync.apply.load_into`: the same
                     copies and fused fingerprints as an in-place load), generation running meanwhile
    swap()           under the replica's model lock (between two decode steps): `param.data = back`, and
                     the old storage becomes the next back buffer

Only tensors the sync wrote completely are swapped; one it wrote in parts (a fused expert tensor of which
only some experts were sent) gets those parts copied into the live tensor at the swap, so a tensor the
trainer did not send keeps its live value — never the stale content of the back buffer. A tied weight
(`lm_head.weight` = `model.embed_tokens.weight`) is one tensor, swapped once. The back buffer is resident:
allocated at the first stage (pages touched then), reused every sync.

The stage also takes the weight sample's sums of the tensors it copies (`engine.sync.verify.WeightSamples`), so
the sample after the swap (`engine.sync.verify.weights_fingerprint`, the "weights did not change" alarm) reads
only what the stage did not write whole — the same value, without reading the model again inside the pause.

Memory: the back buffer is as large as the replica's weights (the replica holds two copies). Pure torch: no
Ray, no runtime.
"""

from __future__ import annotations

import bisect
import contextlib
from collections.abc import Iterable
from typing import Any

import torch

from engine.sync.apply import load_into, named_tensors
from engine.sync.flat import ALIGN
from engine.sync.verify import WeightSamples


def weights_nbytes(model: torch.nn.Module) -> int:
    """Bytes of the model's distinct persistent tensors (what a back buffer costs)."""
    seen: dict[int, int] = {}
    for t in named_tensors(model).values():
        seen[id(t)] = t.numel() * t.element_size()
    return sum(seen.values())


class BackBuffer:
    """The back buffer of `model` (module docstring). `stage` writes a version into it, `swap` makes it live;
    `staged` is the version staged and not yet swapped (None when none)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.front = named_tensors(model)  # name → the live tensor (a Parameter keeps its identity across swaps)
        self.back: dict[int, torch.Tensor] = {}
        self.staged: int | None = None
        self._regions: dict[int, list[torch.Tensor]] = {}  # id(live tensor) → the back regions written
        self._samples: dict[int, tuple[int, int]] = {}  # the stage's weight-sample sums, by back address
        self.live_samples: dict[int, tuple[int, int]] | None = None  # … of the tensors the last swap made live

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.back.values())

    def allocate(self, lock: Any = None) -> None:
        """Allocate the back buffer (done by the first `stage` otherwise): the weights move into one flat
        buffer and the back tensors are views of a second one, each touched now. Moving the live weights
        (copied, then swapped in under `lock`: the replica's model lock) makes both sides of the swap the
        same kind of memory — one large, fresh, touched allocation each; the storage the model was loaded
        into (many allocations, or pages not yet written) otherwise made every other sync's load slower."""
        if self.back:
            return
        unique = list({id(t): t for t in self.front.values()}.values())
        offsets, size = [], 0
        for t in unique:
            offsets.append(size)
            size += -(-t.numel() * t.element_size() // ALIGN) * ALIGN
        device = unique[0].device if unique else torch.device("cpu")

        def views(flat: torch.Tensor) -> list[torch.Tensor]:
            return [flat[o:o + t.numel() * t.element_size()].view(t.dtype).view(t.shape)
                    for t, o in zip(unique, offsets)]

        live = views(torch.empty(max(size, ALIGN), dtype=torch.uint8, device=device))
        with torch.no_grad():
            for new, t in zip(live, unique):
                new.copy_(t.detach())
            with lock if lock is not None else contextlib.nullcontext():
                for new, t in zip(live, unique):
                    t.data = new
        back_flat = torch.zeros(max(size, ALIGN), dtype=torch.uint8, device=device)  # touched now
        self.back = {id(t): b for t, b in zip(unique, views(back_flat))}

    def _targets(self) -> dict[str, torch.Tensor]:
        self.allocate()
        return {name: self.back[id(t)] for name, t in self.front.items()}

    def stage(self, buckets: Iterable[Any], version: int, strict: bool = True) -> int:
        """Copy `buckets` into the back buffer (the live weights are not touched) and remember `version`;
        returns the bytes copied. A second `stage` before `swap` replaces the first."""
        targets = self._targets()
        starts = sorted((b.data_ptr(), key) for key, b in self.back.items())
        regions: dict[int, list[torch.Tensor]] = {}

        def written(target: torch.Tensor) -> None:  # a back tensor or a view of one (a fused expert's slice)
            i = bisect.bisect_right(starts, (target.data_ptr(), float("inf"))) - 1
            regions.setdefault(starts[i][1], []).append(target)

        self.staged = None
        samples = WeightSamples()
        copied = load_into(targets, buckets, strict, written, samples)
        self._regions, self._samples, self.staged = regions, samples.valid(), int(version)
        return copied

    def swap(self, version: int) -> None:
        """Make the staged weights live (call between two decode steps, under the model's lock). Raises
        `RuntimeError` when `version` is not the one staged."""
        if self.staged != int(version):
            raise RuntimeError(f"weight sync v{version}: the replica staged "
                               f"{'nothing' if self.staged is None else f'v{self.staged}'}, cannot swap in v{version}")
        live: dict[int, tuple[int, int]] = {}
        with torch.no_grad():
            for t in {id(t): t for t in self.front.values()}.values():
                parts = self._regions.get(id(t))
                if not parts:
                    continue
                back = self.back[id(t)]
                whole = any(p.data_ptr() == back.data_ptr() and p.numel() == back.numel() for p in parts) or \
                    sum(p.numel() for p in parts) >= back.numel()
                if whole:
                    old = t.data
                    t.data = back
                    self.back[id(t)] = old
                    rec = self._samples.get(back.data_ptr())
                    if rec is not None:
                        live[back.data_ptr()] = rec
                else:  # written in parts: copy those parts into the live tensor (same layout as the back one)
                    for p in parts:
                        offset = p.storage_offset() - back.storage_offset()
                        t.detach().as_strided(p.size(), p.stride(), t.storage_offset() + offset).copy_(p)
        self._regions, self._samples, self.staged = {}, {}, None
        self.live_samples = live

    def take_samples(self) -> dict[int, tuple[int, int]] | None:
        """The weight-sample sums of the tensors the last `swap` made whole (`engine.sync.verify.WeightSamples`:
        taken while the stage copied them), once: the next call returns None. Only for the fingerprint right
        after the swap — an in-place write to the live weights must call `forget_samples` first."""
        live, self.live_samples = self.live_samples, None
        return live

    def forget_samples(self) -> None:
        self.live_samples = None
