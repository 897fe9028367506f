"""Weights out of the `torch` / FSDP2 trainer (the weight-sync export) and its checkpoints.

Export (`export_live`, `export_sharded`): HF-named tensors in the *export dtype* — the dtype the replicas keep
their weights in (`engine.plan.role_parts.rollout_dtype`: bf16 for the production presets), default the
parameters' own — in ~`bucket_bytes` buckets, tied aliases included (the same tensor under both names).

* One process (`export_live`): the live parameters, cast one tensor at a time (no copy when the dtypes agree:
  valid until the next step, the sync packs them into its own buffers at once).
* FSDP2 (`export_sharded`): the model's own `state_dict()` holds the sharded DTensors (no gather). Tensor by
  tensor, in that order on every rank (each gather is a collective): the local shard is cast to the export dtype
  and moved to the device, then all-gathered there (`DTensor.full_tensor`), so the gather moves export-dtype
  bytes and no rank ever builds the full fp32 state, on the host or the device. Rank 0 groups the gathered
  tensors into buckets as they come (`engine.sync.buckets.bucketize`, consumed one bucket ahead by the sync);
  the other ranks gather and drop. Sync bytes = parameters × the export dtype's size (Qwen3-VL-8B in bf16:
  17.5 GB, not 35).

Checkpoints, written into a staging directory and published atomically (`checkpoint.py`):

* one process (`save`): the full state dict as `model.safetensors` (HF names) + `optimizer.pt`;
* FSDP2 (`save_sharded`): torch distributed checkpoint (`torch.distributed.checkpoint`, directory `dcp/`) of the
  *sharded* model and optimizer state dicts — every rank writes its own shards (`__<rank>_0.distcp`, plus the
  coordinator's `.metadata`), nothing is gathered, no rank holds more than its shard on the host. The save's
  collectives and the barriers around it run on `process_groups.checkpoint_group` (gloo, a timeout that covers
  the write). `load` reads either format (DCP re-shards to the loading world, one process included).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import load_file, save_file
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from engine.sync.buckets import bucketize
from engine.trainer import checkpoint as ckpt
from engine.trainer.process_groups import checkpoint_barrier, checkpoint_group

DCP_DIR = "dcp"
"""The sharded checkpoint's directory inside a trainer checkpoint (FSDP2)."""

if TYPE_CHECKING:
    from engine.trainer.torch_trainer import TorchTrainerBackend


def tied_aliases(model: torch.nn.Module) -> dict[str, str]:
    """alias → canonical name for parameters registered under several names (tied embeddings)."""
    first: dict[int, str] = {}
    aliases: dict[str, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in first:
            aliases[name] = first[id(p)]
        else:
            first[id(p)] = name
    return aliases


def full_state_dict(trainer: TorchTrainerBackend) -> dict[str, torch.Tensor]:
    """Full (unsharded) weights in HF names on CPU, tied aliases included; empty on ranks ≠ 0.

    A plain module's own `state_dict()` (detached) is the same dict, ~15× cheaper than `get_model_state_dict`
    (2 against 30 ms for a 500M model); it is used once the first call has checked that both give the same
    names and the very same tensors (not so for a sharded, wrapped or offloaded model: those keep
    `get_model_state_dict`)."""
    if trainer._plain_state is True:
        state = {k: v.detach() for k, v in trainer.model.state_dict().items()}
    else:
        state = get_model_state_dict(trainer.model, options=trainer._state_dict_options())
        if trainer._plain_state is None:
            trainer._plain_state = _same_tensors(state, trainer.model.state_dict())
    if not trainer.is_main:
        return {}
    for alias, canonical in trainer.aliases.items():
        if alias not in state and canonical in state:
            state[alias] = state[canonical]
    return state


def _cast(t: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    return t.to(dtype) if dtype is not None and t.is_floating_point() and t.dtype != dtype else t


def _with_aliases(named: Iterable[tuple[str, torch.Tensor]], aliases: Mapping[str, str]) -> Iterator[tuple[str, torch.Tensor]]:
    """`named`, each canonical tensor followed by its tied aliases (the ones `named` does not carry itself)."""
    by_canonical: dict[str, list[str]] = {}
    for alias, canonical in aliases.items():
        by_canonical.setdefault(canonical, []).append(alias)
    seen: set[str] = set()
    for name, t in named:
        seen.add(name)
        yield name, t
        for alias in by_canonical.get(name, []):
            if alias not in seen:
                seen.add(alias)
                yield alias, t


def export_live(trainer: TorchTrainerBackend, bucket_bytes: int) -> Iterator[dict[str, torch.Tensor]]:
    """One process: the live weights cast to `trainer.export_dtype` (module docstring)."""
    state = full_state_dict(trainer)
    named = ((name, _cast(t.detach(), trainer.export_dtype)) for name, t in state.items())
    yield from bucketize(named, bucket_bytes)


def _gathered(t: torch.Tensor, device: torch.device, dtype: torch.dtype | None) -> torch.Tensor:
    """The full tensor of `t` (a DTensor shard or a plain tensor) on `device` in `dtype`, gathered there."""
    from torch.distributed.tensor import DTensor

    if not isinstance(t, DTensor):
        return _cast(t.detach(), dtype).to(device)
    local = _cast(t.to_local().detach(), dtype).to(device)
    sharded = DTensor.from_local(local, t.device_mesh, t.placements, run_check=False, shape=t.shape,
                                 stride=t.stride())
    return sharded.full_tensor()


def export_sharded(trainer: TorchTrainerBackend, bucket_bytes: int) -> Iterator[dict[str, torch.Tensor]]:
    """FSDP2: gathered tensor by tensor on the device in the export dtype (module docstring)."""
    state = trainer.model.state_dict()  # sharded DTensors and buffers: nothing gathered yet
    skip = {a for a, c in trainer.aliases.items() if a in state and c in state}  # gathered once, under c

    def gathered() -> Iterator[tuple[str, torch.Tensor]]:
        for name, t in state.items():
            if name not in skip:
                yield name, _gathered(t, trainer.device, trainer.export_dtype)

    if not trainer.is_main:
        for _ in gathered():  # the collectives, in the same order as rank 0's
            pass
        return
    yield from bucketize(_with_aliases(gathered(), trainer.aliases), bucket_bytes)


def save(trainer: TorchTrainerBackend, path: str) -> None:
    """Write weights, optimizer and RNG states to directory `path` atomically (see `checkpoint.py`)."""
    weights = full_state_dict(trainer)
    optim_state = get_optimizer_state_dict(trainer.model, trainer.optimizer, options=trainer._state_dict_options())
    staging = ckpt.staging_dir(path, f"step{trainer.global_step}") if trainer.is_main else None
    checkpoint_barrier()
    staging = staging or Path(f"{str(path).rstrip('/')}.tmp-step{trainer.global_step}")
    if trainer.is_main:
        unique = {k: v.detach().contiguous().clone() for k, v in weights.items() if k not in trainer.aliases}
        save_file(unique, str(staging / ckpt.MODEL_FILE), metadata={"format": "pt"})
        torch.save(optim_state, staging / ckpt.OPTIMIZER_FILE)
        (staging / ckpt.STATE_FILE).write_text(json.dumps({"global_step": trainer.global_step,
                                                           "base_lr": trainer.base_lr}))
    torch.save(ckpt.capture_rng(), staging / ckpt.rng_file(trainer.rank))
    checkpoint_barrier()
    if trainer.is_main:
        ckpt.publish(staging, path)
    checkpoint_barrier()


def save_sharded(trainer: TorchTrainerBackend, path: str) -> None:
    """FSDP2: every rank writes its shards of the model and optimizer state (module docstring)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(trainer.model, trainer.optimizer)  # sharded: nothing gathered
    staging = ckpt.staging_dir(path, f"step{trainer.global_step}") if trainer.is_main else None
    checkpoint_barrier()
    staging = staging or Path(f"{str(path).rstrip('/')}.tmp-step{trainer.global_step}")
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(staging / DCP_DIR),
             process_group=checkpoint_group())
    if trainer.is_main:
        (staging / ckpt.STATE_FILE).write_text(json.dumps({"global_step": trainer.global_step,
                                                           "base_lr": trainer.base_lr, "format": "dcp"}))
    torch.save(ckpt.capture_rng(), staging / ckpt.rng_file(trainer.rank))
    checkpoint_barrier()
    if trainer.is_main:
        ckpt.publish(staging, path)
    checkpoint_barrier()


def _load_sharded(trainer: TorchTrainerBackend, root: Path) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_state, optim_state = get_state_dict(trainer.model, trainer.optimizer)
    state = {"model": model_state, "optim": optim_state}
    with warnings.catch_warnings():  # one process (no process group) reading a sharded checkpoint: intended
        warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process.*")
        dcp.load(state, checkpoint_id=str(root / DCP_DIR), process_group=checkpoint_group())
    set_state_dict(trainer.model, trainer.optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])


def load(trainer: TorchTrainerBackend, path: str) -> None:
    """Restore what `save` or `save_sharded` wrote (same model architecture; the world size may differ for the
    weights and optimizer, RNG states are restored for ranks that have a file)."""
    root = Path(path)
    if (root / DCP_DIR).is_dir():
        _load_sharded(trainer, root)
    else:
        _load_full(trainer, root)
    state = json.loads((root / ckpt.STATE_FILE).read_text())
    trainer.global_step = int(state["global_step"])
    trainer.base_lr = float(state["base_lr"])
    rng_path = root / ckpt.rng_file(trainer.rank)
    if rng_path.exists():
        ckpt.restore_rng(torch.load(rng_path, map_location="cpu", weights_only=False))
    trainer._snapshot = None


def _load_full(trainer: TorchTrainerBackend, root: Path) -> None:
    options = trainer._state_dict_options(loading=True)
    weights: dict[str, torch.Tensor] = {}
    optim_state: dict[str, Any] = {}
    if trainer.is_main or not options.broadcast_from_rank0:
        weights = load_file(str(root / ckpt.MODEL_FILE))
        for alias, canonical in trainer.aliases.items():
            weights.setdefault(alias, weights[canonical])
        optim_state = torch.load(root / ckpt.OPTIMIZER_FILE, map_location="cpu", weights_only=False)
    set_model_state_dict(trainer.model, weights, options=options)
    set_optimizer_state_dict(trainer.model, trainer.optimizer, optim_state, options=options)


def _same_tensors(state: Mapping[str, torch.Tensor], direct: Mapping[str, torch.Tensor]) -> bool:
    """Whether `direct` has `state`'s names in the same order, each the same tensor (storage, offset, shape,
    strides, dtype, device; plain tensors, no DTensor)."""
    if list(state) != list(direct):
        return False
    for k, a in state.items():
        b = direct[k]
        if type(a) is not torch.Tensor or type(b) not in (torch.Tensor, torch.nn.Parameter):
            return False
        if (a.data_ptr(), a.shape, a.stride(), a.dtype, a.device) != (b.data_ptr(), b.shape, b.stride(), b.dtype,
                                                                      b.device):
            return False
    return True
