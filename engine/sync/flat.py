"""The unit every weight-sync transport moves: a flat byte buffer in the model's dtype plus its index.

A `FlatBucket` is one contiguous `uint8` tensor (on the sender's device: CPU for gloo / the object store, the
GPU for NCCL) holding the bucket's tensors back to back, each at an offset aligned to `ALIGN` bytes, and an
index of `(name, dtype, shape, offset, nbytes)`. The bytes are the parameters' own — bf16 stays bf16, no
widening, no numpy conversion — so a bucket costs one copy on each side (pack into the buffer, copy out of
it into the model) and the receiver's tensors are views of the buffer (`tensors()`).

Fingerprint (the delivery check, `engine.sync.verify`): the buffer read as little-endian int64 words w_i,

    fp = (Σ_i w_i  +  K · Σ_i w_{7i})  mod 2^64        K = 0x9E3779B97F4A7C15

two sums the device already does at memory bandwidth where the bytes are (torch reductions, no host copy).
Any change to one word changes Σ w_i; a swap of two words changes the strided term unless both lie on, or
both off, the stride. It detects corruption and lost/stale loads, not an adversary. Both sums are linear, so
the fingerprint of a buffer is the sum over any split of it into 8-byte-aligned regions (`Fingerprint.add`,
the strided term indexed by the global word number): on the host the pack (`flatten`) and the receiver's
load (`engine.sync.apply`) fingerprint each `CHUNK` right after copying it, while it is still in cache, instead
of reading the whole buffer from memory a second time (measured on this host: copy + separate fingerprint
≈ 2.7 GB/s, fused ≈ the copy alone). With the native kernel (`engine.sync.native`, built on first use) each
`copy_fingerprinted` / `Fingerprint.add` is one C pass instead — non-temporal stores, the sums from registers,
the same fingerprint bit for bit; numpy in `CHUNK`s is the fallback.

Pickling (the Ray object store) turns the buffer into a numpy `uint8` array — Ray stores numpy buffers
out-of-band, so `ray.get` returns a zero-copy, read-only view of shared memory — and unpickling wraps it back
with `torch.from_numpy` without a copy. Raw bytes only: numpy never sees a bf16 value.
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from engine.sync import native

ALIGN = 64
"""Byte alignment of each tensor in a bucket (a cache line; any dtype's element size divides it)."""
_K = 0x9E3779B97F4A7C15 - 2**64  # the golden-ratio constant as a signed int64
_MASK = 2**64 - 1
CHUNK = 256 * 1024
"""Bytes copied and then fingerprinted at a time on the host (fits the L2 cache; a multiple of 8)."""

Entry = tuple[str, str, tuple[int, ...], int, int]
"""(HF name, torch dtype name without `torch.`, shape, byte offset, nbytes)."""


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r} in a weight bucket index")
    return dtype


def as_tensor(value: Any) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.detach()
    with warnings.catch_warnings():  # read-only numpy (Ray's object store): only read
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        import numpy as np

        return torch.from_numpy(np.ascontiguousarray(value))


@dataclass
class FlatBucket:
    """One bucket: `data` (1-d uint8, length a multiple of `ALIGN`) and its `index` (module docstring).
    `seq` is the bucket's position in its version, `fingerprint` the sender's (None until computed)."""

    index: list[Entry]
    data: torch.Tensor
    seq: int = 0
    fingerprint: int | None = field(default=None, compare=False)

    @property
    def nbytes(self) -> int:
        """Payload bytes (the tensors'; the alignment padding excluded)."""
        return sum(e[4] for e in self.index)

    @property
    def names(self) -> list[str]:
        return [e[0] for e in self.index]

    def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, tensor) for each entry: views of `data`, in the sender's dtype and shape."""
        for name, dtype, shape, offset, nbytes in self.index:
            yield name, self.data[offset:offset + nbytes].view(_dtype(dtype)).view(shape)

    def items(self) -> Iterator[tuple[str, torch.Tensor]]:  # so a FlatBucket reads like a `Bucket` dict
        return self.tensors()

    def __reduce__(self) -> tuple:
        data = self.data if self.data.device.type == "cpu" else self.data.cpu()
        return (_rebuild, (self.index, data.numpy(), self.seq))  # the receiver computes its own fingerprint


def _rebuild(index: list[Entry], array: Any, seq: int) -> FlatBucket:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return FlatBucket(index, torch.from_numpy(array), seq)


def fingerprint(data: torch.Tensor) -> int:
    """The bucket checksum of the module docstring, computed on `data`'s device (length a multiple of 8)."""
    if data.device.type == "cpu":
        fp = Fingerprint()
        array = host_bytes(data)
        sums = native.sum_fp(array, 0)
        if sums is not None:
            fp.total, fp.strided = sums
            return fp.value
        for lo in range(0, array.size, CHUNK):
            fp.add(array[lo:lo + CHUNK], lo)
        return fp.value
    words = data.view(torch.int64)
    total = int(words.sum()) + _K * int(words[::7].sum())
    return total & _MASK


def host_bytes(t: torch.Tensor) -> Any:
    """A contiguous CPU tensor's bytes as a numpy uint8 array (no copy; read-only sources stay read-only)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return t.reshape(-1).view(torch.uint8).numpy()


class Fingerprint:
    """The fingerprint of a host buffer accumulated region by region (module docstring): `add(region, at)`
    with `region` a numpy uint8 array of the buffer's bytes starting at byte `at` (both multiples of 8)."""

    def __init__(self) -> None:
        self.total = 0
        self.strided = 0

    def add(self, region: Any, at: int) -> None:
        sums = native.sum_fp(region, at)
        if sums is not None:
            self.total += sums[0]
            self.strided += sums[1]
            return
        words = region.view("<u8")
        self.total += int(words.sum())
        self.strided += int(words[(-(at // 8)) % 7::7].sum())

    @property
    def value(self) -> int:
        return (self.total + _K * self.strided) & _MASK


_COPY_STATS = [0.0, 0]
_COPY_LOCK = threading.Lock()


def copy_stats() -> tuple[float, int]:
    """(seconds, bytes) this process has spent in `copy_fingerprinted`, all threads together (`bytes`: the
    regions fingerprinted); the difference of two readings is one side's busy time in a sync."""
    with _COPY_LOCK:
        return _COPY_STATS[0], _COPY_STATS[1]


def copy_batch(regions: list[tuple[int, int, int, int, int, int]], fp: Fingerprint, zero_pad: bool = False,
               samples: list[int] | None = None, stride: int = 0) -> bool:
    """`copy_fingerprinted` for many regions of one buffer in one native call, by address
    (`engine.sync.native.copy_fp_batch`: no interpreter between the tensors of a bucket); adds their sums to
    `fp` and counts the time (`copy_stats`). With `samples` (a list, and `stride` > 0) it is filled with each
    region's sampled byte sum (`engine.sync.native.copy_fp_batch_sampled`). False, with nothing done, when the
    kernel is not loaded."""
    t0 = time.perf_counter()
    if samples is not None and stride > 0:
        got = native.copy_fp_batch_sampled(regions, stride)
        if got is None:
            return False
        sums = got[:2]
        samples[:] = got[2]
    else:
        sums = native.copy_fp_batch(regions, zero_pad)
    if sums is None:
        return False
    dt = time.perf_counter() - t0
    fp.total += sums[0]
    fp.strided += sums[1]
    with _COPY_LOCK:
        _COPY_STATS[0] += dt
        _COPY_STATS[1] += sum(r[4] for r in regions)
    return True


def copy_fingerprinted(dst: Any, src: Any, n: int, fp: Fingerprint, at: int, seen: Any) -> None:
    """Copy the first `n` bytes of `src` into `dst` (numpy uint8 arrays) `CHUNK` by `CHUNK`, adding each chunk of
    `seen` to `fp` while it is still in cache. `seen` is the buffer's region that starts at byte `at` (length a
    multiple of 8, its padding beyond `n` included): `dst` on the sender's pack, `src` on a receiver's load.
    With the native kernel (`engine.sync.native`) all of it is one call, one pass, the same fingerprint. Its
    time and bytes are counted (`copy_stats`)."""
    t0 = time.perf_counter()
    _copy_fingerprinted(dst, src, n, fp, at, seen)
    dt = time.perf_counter() - t0
    with _COPY_LOCK:
        _COPY_STATS[0] += dt
        _COPY_STATS[1] += seen.size


def _copy_fingerprinted(dst: Any, src: Any, n: int, fp: Fingerprint, at: int, seen: Any) -> None:
    sums = native.copy_fp(dst, src, n, seen, at)
    if sums is not None:
        fp.total += sums[0]
        fp.strided += sums[1]
        return
    for lo in range(0, seen.size, CHUNK):
        hi = min(lo + CHUNK, seen.size)
        if lo < n:
            np.copyto(dst[lo:min(hi, n)], src[lo:min(hi, n)])
        fp.add(seen[lo:hi], at + lo)


def layout(named: Iterable[tuple[str, Any]]) -> tuple[list[Entry], int]:
    """The index of `named` packed back to back at `ALIGN`ed offsets, and the buffer size it needs."""
    index: list[Entry] = []
    offset = 0
    for name, t in named:
        t = as_tensor(t)
        nbytes = t.numel() * t.element_size()
        index.append((name, str(t.dtype).removeprefix("torch."), tuple(t.shape), offset, nbytes))
        offset = _aligned(offset + nbytes)
    return index, max(offset, ALIGN)


def flatten(bucket: Any, seq: int = 0, device: torch.device | str | None = None,
            ring: BufferRing | None = None) -> FlatBucket:
    """Pack `bucket` (name → tensor or array, or `(name, tensor)` pairs) into one buffer on `device` (default:
    the first tensor's device, CPU for numpy) — a buffer of `ring` when given, else a new one — and fingerprint it.
    A `FlatBucket` is returned as is (fingerprinted if it was not)."""
    if isinstance(bucket, FlatBucket):
        if bucket.fingerprint is None:
            bucket.fingerprint = fingerprint(bucket.data)
        return bucket
    pairs = [(n, as_tensor(t)) for n, t in (bucket.items() if hasattr(bucket, "items") else bucket)]
    index, size = layout(pairs)
    if device is None:
        device = pairs[0][1].device if pairs else torch.device("cpu")
    data = ring.get(size, device) if ring is not None else torch.empty(size, dtype=torch.uint8, device=device)
    if data.device.type == "cpu" and all(t.device.type == "cpu" for _, t in pairs):
        return FlatBucket(index, data, seq, _pack_host(pairs, index, data))
    with torch.no_grad():
        for (_, t), (_, dtype, shape, offset, nbytes) in zip(pairs, index):
            data[offset:offset + nbytes].view(t.dtype).view(shape).copy_(t)
            pad = _aligned(offset + nbytes)
            if pad > offset + nbytes:
                data[offset + nbytes:pad].zero_()
        if not index:
            data.zero_()
    return FlatBucket(index, data, seq, fingerprint(data))


def _pack_host(pairs: list[tuple[str, torch.Tensor]], index: list[Entry], data: torch.Tensor) -> int:
    """`flatten` on the host: each tensor's bytes copied into its region, the padding zeroed, fingerprinted chunk
    by chunk as it is written (`copy_fingerprinted`); returns the fingerprint."""
    fp = Fingerprint()
    buf = host_bytes(data)
    if not index:
        buf[:] = 0
        return fp.value
    if native.kernel() is not None:  # every tensor in one native call, padding zeroed there
        base, keep, regions = data.data_ptr(), [], []
        for (_, t), (_, _, _, offset, nbytes) in zip(pairs, index):
            src = t.contiguous()
            keep.append(src)  # alive until the call returns
            regions.append((base + offset, src.data_ptr(), nbytes, base + offset, _aligned(offset + nbytes) - offset,
                            offset))
        if copy_batch(regions, fp, zero_pad=True):
            return fp.value
    for (_, t), (_, _, _, offset, nbytes) in zip(pairs, index):
        end = _aligned(offset + nbytes)
        region = buf[offset:end]
        region[nbytes:] = 0
        copy_fingerprinted(region, host_bytes(t.contiguous()), nbytes, fp, offset, region)
    return fp.value


class BufferRing:
    """`slots` flat buffers used in turn, each grown to the largest bucket it held: the pipeline's buffers stay
    resident across buckets and syncs, so packing and receiving write into touched pages instead of paying
    first-touch page faults on every bucket. Safe when a bucket is done with before its slot comes round again:
    with `engine.sync.pipeline.ahead(depth)` and a consumer that copies each bucket out before taking the next,
    depth + 2 slots suffice (one consumed, `depth` queued, one being filled)."""

    def __init__(self, slots: int) -> None:
        self.slots: list[torch.Tensor | None] = [None] * max(1, slots)
        self.next = 0

    def get(self, size: int, device: torch.device | str) -> torch.Tensor:
        i, self.next = self.next, (self.next + 1) % len(self.slots)
        buf = self.slots[i]
        if buf is None or buf.numel() < size or buf.device != torch.device(device):
            buf = self.slots[i] = torch.empty(size, dtype=torch.uint8, device=device)
        return buf[:size]


def flat_buckets(buckets: Iterable[Any], device: torch.device | str | None = None) -> Iterator[FlatBucket]:
    """Each bucket of a trainer's `export_weights` as a `FlatBucket`, numbered in order."""
    for seq, bucket in enumerate(buckets):
        fb = flatten(bucket, seq, device)
        fb.seq = seq
        yield fb
