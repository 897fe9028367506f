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
    FromRank0                 what rank 0 broadcast as objects while it was built, delivered to the other ranks
                              (the fake group delivers none), and rank 0's built model, which theirs must match

Scalar reads of fake tensors (`.item()`, `float(t)`) cannot run; a constant built with `torch.tensor([...])` can
(the fake mode keeps the constant), which is how the trainer's scalar all-reduces pass through.
"""

from __future__ import annotations

import contextlib
import copy
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


class FromRank0:
    """What the ranks other than 0 receive from rank 0 in a rehearsal of an FSDP2 trainer (one per rehearsal; rank 0
    is rehearsed first). At launch a rank other than 0 builds a meta skeleton and gets its shards from rank 0's
    load (`engine.trainer.fsdp.shard_from_rank0`): torch's `set_model_state_dict(full_state_dict,
    broadcast_from_rank0=True)` (`_broadcast_state_dict` in `torch.distributed._state_dict_utils`) has rank 0 send
    {key: `_TensorInfo(size, dtype)`, or the value of a 0-dim tensor or non-tensor} by `broadcast_object_list`,
    then every tensor by `broadcast`, each rank allocating the full tensor from the received size and dtype and
    keeping its slice. Under the fake process group the object broadcast delivers nothing — a rank other than 0
    would unpickle whatever its unwritten size buffer says, or nothing, load no key and fail — so within
    `scope(name)` (one per backend build) `dist.broadcast_object_list` is replaced:

        rank 0      its object broadcasts run (pickled, sent to nobody) and are recorded as a receiver unpickles
                    them (tensors become real tensors of their shape and dtype; a fake one's values are unknown:
                    zeros)
        rank r > 0  its k-th object broadcast from rank 0 receives rank 0's k-th; the scope fails if the rank made
                    fewer or more than rank 0 (a real run would wait forever in the unmatched one)

    The tensor broadcasts move no data on the fake group either, but their shapes and dtypes come from the
    received list, so every rank runs torch's own code path with rank 0's keys. `compare(name, model)` checks what
    that path cannot: the built model's parameters and buffers (name, global shape, dtype) against rank 0's — a
    rank whose skeleton has another dtype, an untied weight or a buffer fewer would run FSDP2's collectives on
    other tensors than rank 0's."""

    def __init__(self) -> None:
        self.objects: dict[str, list[list[Any]]] = {}
        self.models: dict[str, dict[str, tuple[tuple[int, ...], str]]] = {}

    @contextlib.contextmanager
    def scope(self, name: str) -> Iterator[None]:
        rank = dist.get_rank()
        if rank == 0:
            sent = self.objects[name] = []
        elif name in self.objects:
            sent = self.objects[name]
        else:
            raise RuntimeError(f"rank 0's {name} build was not rehearsed, and ranks other than 0 receive from it")
        received = 0
        original = dist.broadcast_object_list

        def broadcast_object_list(object_list: list[Any], src: int | None = None, group: Any = None,
                                  device: Any = None, group_src: int | None = None) -> None:
            nonlocal received
            from_rank0 = src == 0 or (src is None and group_src in (None, 0) and group is None)
            if rank == 0 or not from_rank0:  # rank 0 pickles and sends; the fake group takes it
                original(object_list, src=src, group=group, device=device, group_src=group_src)
                if from_rank0:
                    sent.append(as_received(object_list))
                return
            if received >= len(sent):
                raise RuntimeError(f"rank {rank} makes object broadcast {received + 1} from rank 0 building the "
                                   f"{name}, where rank 0 made {len(sent)}: the run would hang there")
            object_list[:] = as_received(sent[received])
            received += 1

        dist.broadcast_object_list = broadcast_object_list
        try:
            yield
        finally:
            dist.broadcast_object_list = original
        if rank and received != len(sent):
            raise RuntimeError(f"rank {rank} made {received} of the {len(sent)} object broadcasts rank 0 made building "
                               f"the {name} (it did not take launch's path from rank 0's load): the run would hang")

    def compare(self, name: str, model: torch.nn.Module) -> None:
        """Rank 0: record `model`'s parameters and buffers; other ranks: raise naming the first that differ."""
        mine = {n: (tuple(t.shape), str(t.dtype).removeprefix("torch."))
                for n, t in [*model.named_parameters(), *model.named_buffers()]}
        if dist.get_rank() == 0:
            self.models[name] = mine
            return
        theirs = self.models.get(name)
        if theirs is None:
            raise RuntimeError(f"rank 0's {name} was not built, and ranks other than 0 must match it")
        problems = [f"{n} only on rank 0" for n in theirs if n not in mine]
        problems += [f"{n} not on rank 0" for n in mine if n not in theirs]
        problems += [f"{n} {mine[n]} vs rank 0's {theirs[n]}" for n in mine if n in theirs and mine[n] != theirs[n]]
        if problems:
            more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
            raise RuntimeError(f"the {name}'s parameters and buffers differ from rank 0's: "
                               f"{'; '.join(problems[:3])}{more}")

    def largest_tensor(self, name: str) -> int:
        """Bytes of the largest full tensor rank 0 broadcast building `name` (each rank allocates one at a time)."""
        sizes = [v.size.numel() * v.dtype.itemsize for objects in self.objects.get(name, []) for obj in objects
                 if isinstance(obj, Mapping) for v in obj.values()
                 if isinstance(v, tuple) and isinstance(getattr(v, "size", None), torch.Size)]
        return max(sizes, default=0)


def as_received(obj: Any) -> Any:
    """`obj` as `broadcast_object_list` delivers it on another rank: a fresh copy, tensors as real CPU tensors of their
    shape and dtype (zeros: a fake tensor has no values to send)."""
    if isinstance(obj, torch.Tensor):
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        with unset_fake_temporarily():
            return torch.zeros(tuple(obj.shape), dtype=obj.dtype)
    if isinstance(obj, Mapping):
        return {k: as_received(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [as_received(v) for v in obj]
    return copy.deepcopy(obj)
