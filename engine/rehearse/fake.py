"""The rehearsal's stand-ins for hardware: torch's fake process group and fake tensors.

    fake_world(rank, world)   `torch.distributed` initialised with the `"fake"` backend (`FakeStore`): every
                              collective returns at once without moving data, so one process can be any rank of
                              a world of any size — the trainer's default group and every sub-group built on it
                              (FSDP2's mesh, Megatron's TP/PP/CP/EP/DP groups)
    fake_mode()               a `FakeTensorMode`: tensors carry shape, dtype, device and strides but no storage,
                              so a 30B model's parameters, activations, gradients and optimizer state cost nothing
    model_from_config(...)    the HF model of a config.json (`transformers` `from_config`) under that mode: the
                              real module tree at the real widths, with fake parameters
    tensor_bytes(obj)         bytes of every distinct tensor in a nested dict/list (what a state dict would hold)

Scalar reads of fake tensors (`.item()`, `float(t)`) cannot run; a constant built with `torch.tensor([...])` can
(the fake mode keeps the constant), which is how the trainer's scalar all-reduces pass through.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist


@contextlib.contextmanager
def fake_world(rank: int, world: int) -> Iterator[None]:
    """`torch.distributed` as rank `rank` of `world` on the fake backend, torn down on exit."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    try:
        yield
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


_COALESCED = ("allreduce_coalesced_", "reduce_scatter_tensor_coalesced_", "allgather_into_tensor_coalesced_")
_LIBRARY: list[Any] = []


def coalesced_collectives_on_fake_tensors() -> None:
    """Give c10d's coalesced collectives (Megatron DDP reduces its gradient buckets under
    `torch.distributed._coalescing_manager`) the meta kernel torch gives the plain ones
    (`torch.distributed._meta_registrations`: the tensors are left as they are, a `FakeWork` is returned), so they
    run on fake tensors over the fake group. Once per process."""
    if _LIBRARY:
        return
    from torch.distributed._meta_registrations import create_fakework

    lib = torch.library.Library("c10d", "IMPL")
    for op in _COALESCED:
        lib.impl(op, lambda *args: create_fakework(args, return_first_arg=False), "Meta")
    _LIBRARY.append(lib)


def fake_mode() -> Any:
    """A fresh `FakeTensorMode` that accepts real inputs (the batch's token ids stay real tensors)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode(allow_non_fake_inputs=True)


def hf_config(config: Mapping[str, Any]) -> Any:
    """The `transformers` config object of a config.json dict."""
    from transformers import AutoConfig

    d = dict(config)
    return AutoConfig.for_model(d.pop("model_type"), **d)


def model_from_config(config: Mapping[str, Any], dtype: Any, mode: Any, attn_implementation: str | None = None) -> Any:
    """The HF model of `config` (a config.json dict) in `dtype`, its parameters fake tensors of `mode`, in eval
    mode (as `engine.models.loader.load_causal_lm` returns it). Vision-language configs build the
    `*ForConditionalGeneration` model, as the loader does."""
    from engine.models.loader import auto_model_class

    cfg = hf_config(config)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    kwargs = {"attn_implementation": attn_implementation} if attn_implementation else {}
    with mode:
        model = auto_model_class(cfg).from_config(cfg, dtype=dtype, **kwargs)
    return model.eval()


def pin_in_place(model: Any) -> Any:
    """Make `model.to(...)` return `model` unmoved. The trainer moves the loaded model to its device before
    sharding; on the stand-in CPU that move is a no-op torch cannot perform on fake parameters (it swaps
    tensor-subclass parameters, and refuses a swap of a weakly referenced one). The move's device cost — the
    whole model on the device before `fully_shard` — is reported from the model's bytes instead."""
    model.to = lambda *args, **kwargs: model
    return model


def tensor_bytes(obj: Any) -> int:
    """Bytes of the distinct tensors in `obj` (tensors, DTensors as their local shard, nested dicts/lists)."""
    seen: set[int] = set()
    held: list[torch.Tensor] = []  # `to_local()` makes a new object: held, so no later one reuses its id
    total = 0

    def walk(x: Any) -> None:
        nonlocal total
        if isinstance(x, torch.Tensor):
            if id(x) in seen:
                return
            seen.add(id(x))
            held.append(x)
            local = x.to_local() if hasattr(x, "to_local") else x
            total += local.numel() * local.element_size()
        elif isinstance(x, Mapping):
            for v in x.values():
                walk(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)

    walk(obj)
    return total


def dtype_bytes(tensors: Mapping[str, torch.Tensor]) -> dict[str, int]:
    """Bytes by dtype name of a name → tensor mapping."""
    out: dict[str, int] = {}
    for t in tensors.values():
        name = str(t.dtype).removeprefix("torch.")
        out[name] = out.get(name, 0) + t.numel() * t.element_size()
    return out


def tracker_peak(tracker: Any) -> tuple[int, dict[str, int]]:
    """(total, by category) of a torch memory tracker's peak snapshot, summed over devices."""
    total, cats = 0, {}
    for stats in tracker.get_tracker_snapshot("peak").values():
        for k, v in stats.items():
            name = str(k).split(".")[-1].lower()
            if name == "total":
                total += int(v)
            elif v:
                cats[name] = cats.get(name, 0) + int(v)
    return total, cats
