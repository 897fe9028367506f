"""The receiving end of a weight sync: copy HF-named tensors (a `FlatBucket`'s views of its received buffer,
or a dict of tensors / numpy arrays) into a torch model's parameters.

Names are HF *checkpoint* names. Where the in-memory model fuses what the checkpoint keeps per expert
(transformers 5's MoE blocks: `experts.gate_up_proj` [E, 2I, H] = per expert cat(gate_proj, up_proj) on dim 0,
`experts.down_proj` [E, H, I]), `experts.<e>.{gate,up,down}_proj.weight` is written into its slice of the
fused tensor — what a Megatron export or a vLLM-bound bucket carries lands in an `hf` replica unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

import torch

from engine.sync import native
from engine.sync.flat import ALIGN, FlatBucket, Fingerprint, _dtype, as_tensor, copy_batch, copy_fingerprinted, host_bytes
from engine.sync.verify import SAMPLE_STRIDE, WeightSamples


def named_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every persistent tensor of `model` by its state-dict (HF) name — tied weights appear under each of
    their names (`lm_head.weight` and `model.embed_tokens.weight` are then the same tensor)."""
    return dict(model.state_dict(keep_vars=True))


_EXPERT = re.compile(r"^(?P<prefix>.+\.experts)\.(?P<e>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)\.weight$")


def fused_expert_view(targets: dict[str, torch.Tensor], name: str) -> torch.Tensor | None:
    """The slice of a fused expert tensor that checkpoint name `name` stands for (None when it is not one)."""
    m = _EXPERT.match(name)
    if m is None:
        return None
    e, prefix, proj = int(m["e"]), m["prefix"], m["proj"]
    if proj == "down_proj":
        fused = targets.get(f"{prefix}.down_proj")
        return None if fused is None or fused.dim() != 3 else fused.detach()[e]
    fused = targets.get(f"{prefix}.gate_up_proj")
    if fused is None or fused.dim() != 3:
        return None
    half = fused.shape[1] // 2
    return fused.detach()[e, :half] if proj == "gate_proj" else fused.detach()[e, half:]


def load_buckets_into(model: torch.nn.Module, buckets: Iterable[Any], strict: bool = True) -> int:
    """Copy each tensor into the model tensor of the same name, in place, and return the bytes copied.

    The sources may be read-only (zero-copy views of Ray's object store): they are only read, and copied into
    the parameter (dtype cast and device move included), so nothing outside `model` is written. With
    `strict`, an unknown name or a shape mismatch raises `KeyError` / `ValueError`; unknown names are skipped
    otherwise. A host `FlatBucket` is fingerprinted as it is copied (`load_flat`), its `fingerprint` set.
    """
    return load_into(named_tensors(model), buckets, strict)


def load_into(targets: dict[str, torch.Tensor], buckets: Iterable[Any], strict: bool = True,
              written: Callable[[torch.Tensor], None] | None = None, samples: WeightSamples | None = None) -> int:
    """`load_buckets_into` with the destination tensors by name (`named_tensors` of a model, or a back buffer's:
    `engine.sync.staging`); `written(target)` is called with each tensor (or fused-expert slice) written.
    The buckets' iterator is closed when this returns or raises: a transport's receiver then acknowledges
    what was not loaded at once, so a failed load never leaves the sender waiting out its timeout (while the
    error and its traceback, which would keep the iterator alive, are reported). With `samples`, the native
    load records each tensor's weight-sample sum as it copies it (`engine.sync.verify.WeightSamples`), every
    other write is marked touched."""
    copied = 0
    it = iter(buckets)
    try:
        with torch.no_grad():
            for bucket in it:
                if isinstance(bucket, FlatBucket) and bucket.data.device.type == "cpu":
                    copied += load_flat(targets, bucket, strict, written, samples)
                    continue
                for name, array in bucket.items():
                    target = _target(targets, name, strict)
                    if target is not None:
                        copied += _copy(name, target, as_tensor(array))
                        if samples is not None:
                            samples.touched(target)
                        if written is not None:
                            written(target)
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()
    return copied


def _target(targets: dict[str, torch.Tensor], name: str, strict: bool) -> torch.Tensor | None:
    """The model tensor (or fused-expert slice) that weight `name` loads into; None (strict: KeyError) if none."""
    target = targets.get(name)
    if target is None:
        target = fused_expert_view(targets, name)
    if target is None and strict:
        raise KeyError(f"weight {name!r} is not a tensor of the model")
    return target


def _copy(name: str, target: torch.Tensor, source: torch.Tensor) -> int:
    if tuple(target.shape) != tuple(source.shape):
        raise ValueError(f"shape mismatch for {name!r}: model {tuple(target.shape)}, got {tuple(source.shape)}")
    target.detach().copy_(source, non_blocking=False)
    return source.numel() * source.element_size()


def load_flat(targets: dict[str, torch.Tensor], bucket: FlatBucket, strict: bool = True,
              written: Callable[[torch.Tensor], None] | None = None, samples: WeightSamples | None = None) -> int:
    """Copy a host bucket's tensors into `targets` and fingerprint the bucket's bytes on the way: each `CHUNK` of
    the received buffer is added to the fingerprint right after it was copied out, while it is in cache (one
    read of the buffer in all). A target of another dtype or layout (a fused expert slice) takes the general
    copy, its region fingerprinted after. Sets `bucket.fingerprint` (= `fingerprint(bucket.data)`); `written` as
    for `load_into`. With the native kernel, the copies of all tensors that take the direct path are one native
    call (`_load_batched`); `samples` as for `load_into` (the numpy path records none: every target touched)."""
    data = bucket.data
    if native.kernel() is not None and data.dtype == torch.uint8 and data.dim() == 1 and data.is_contiguous():
        return _load_batched(targets, bucket, strict, written, samples)
    fp = Fingerprint()
    buf = host_bytes(bucket.data)
    covered = copied = 0
    for (name, view), (_, _, _, offset, nbytes) in zip(bucket.tensors(), bucket.index):
        end = min(buf.size, offset + nbytes + (-(offset + nbytes)) % ALIGN)  # the tensor and its padding
        region = buf[offset:end]
        target = _target(targets, name, strict)
        if target is None:
            copy_fingerprinted(region, region, 0, fp, offset, region)
        elif (target.dtype == view.dtype and target.device.type == "cpu" and target.is_contiguous()
              and tuple(target.shape) == tuple(view.shape)):
            copy_fingerprinted(host_bytes(target.detach()), region, nbytes, fp, offset, region)
            copied += nbytes
        else:
            copied += _copy(name, target, view)
            copy_fingerprinted(region, region, 0, fp, offset, region)
        if target is not None and written is not None:
            written(target)
        if target is not None and samples is not None:
            samples.touched(target)
        covered = end
    if covered < buf.size:
        copy_fingerprinted(buf[covered:], buf[covered:], 0, fp, covered, buf[covered:])
    bucket.fingerprint = fp.value
    return copied


def _load_batched(targets: dict[str, torch.Tensor], bucket: FlatBucket, strict: bool,
                  written: Callable[[torch.Tensor], None] | None, samples: WeightSamples | None = None) -> int:
    """`load_flat` with the kernel: every direct copy (same dtype, shape, contiguous on the host) and the
    fingerprint of every region (tensor and padding, the general copies' too) gathered into one
    `copy_batch` call, by address — each entry checked to lie inside the bucket's buffer, each target to
    hold exactly its bytes. The general copies (another dtype or layout, a fused expert slice) run first. With
    `samples` the call also sums each direct copy's sampled bytes, recorded by the target's address."""
    data = bucket.data
    size, base = data.numel(), data.data_ptr()
    regions: list[tuple[int, int, int, int, int, int]] = []
    direct: list[tuple[int, int, int]] = []  # (region index, target address, bytes) of each direct copy
    covered = copied = 0
    for name, dtype, shape, offset, nbytes in bucket.index:
        end = min(size, offset + nbytes + (-(offset + nbytes)) % ALIGN)  # the tensor and its padding
        if offset < covered or offset % 8 or offset + nbytes > size:
            raise ValueError(f"weight bucket {bucket.seq}: entry {name!r} (bytes {offset}…{offset + nbytes}) is "
                             f"not inside its {size}-byte buffer in order")
        target = _target(targets, name, strict)
        if target is None:
            regions.append((0, 0, 0, base + offset, end - offset, offset))
        elif (target.dtype == _dtype(dtype) and target.device.type == "cpu" and target.is_contiguous()
              and tuple(target.shape) == tuple(shape) and target.numel() * target.element_size() == nbytes):
            direct.append((len(regions), target.data_ptr(), nbytes))
            regions.append((target.data_ptr(), base + offset, nbytes, base + offset, end - offset, offset))
            copied += nbytes
        else:
            copied += _copy(name, target, data[offset:offset + nbytes].view(_dtype(dtype)).view(shape))
            regions.append((0, 0, 0, base + offset, end - offset, offset))
            if samples is not None:
                samples.touched(target)
        if target is not None and written is not None:
            written(target)
        covered = end
    if covered < size:
        regions.append((0, 0, 0, base + covered, size - covered, covered))
    fp = Fingerprint()
    sums: list[int] | None = [] if samples is not None else None
    if not copy_batch(regions, fp, samples=sums, stride=SAMPLE_STRIDE):  # the kernel was just found loaded
        raise RuntimeError("the native copy kernel went away during a weight load")
    if samples is not None and sums is not None:
        for i, ptr, nbytes in direct:
            samples.record(ptr, nbytes, sums[i])
    bucket.fingerprint = fp.value
    return copied
