"""The version's weights of the `torch` / FSDP2 trainer: the parameter snapshot taken at each sync, the exact swap
in and out of the live parameters, and its place in a checkpoint taken between two syncs.

The snapshot θ_v (this rank's parameters, or its FSDP2 shards, in host memory — pinned when CUDA is available)
is the weights of the current parameter version v: `snapshot_params` copies the live parameters at each sync.
It is π_prox in decoupled mode, and what the replicas must be given when a run resumes between two syncs
(`engine.runtime.trainer_actor`): the live weights θ_s have moved `since_sync` steps past θ_v by then.

Swap (`snapshot_in`): the live values are copied into a second host buffer set (`_live`), the snapshot copied in,
and afterwards the live values copied back. `copy_` between equal dtypes is exact, so the live parameters come
back bit for bit; both buffer sets are allocated once and reused.

In a checkpoint (`trainer/` of a checkpoint whose `since_sync > 0`, written next to the live weights):

    version.safetensors     one process: θ_v as full HF-named weights (tied aliases stored once)
    version_dcp/            FSDP2: θ_v's shards, torch distributed checkpoint (every rank writes its own)

written with the snapshot swapped in by the same writers as the live weights, and read back (`load_version`)
by loading them into the parameters with the live values set aside, snapshotting, and restoring the live
values — so either format re-shards to the loading world like the live weights do.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from engine.trainer.torch_trainer import TorchTrainerBackend

VERSION_FILE = "version.safetensors"
VERSION_DCP_DIR = "version_dcp"


def cpu_buffers(trainer: TorchTrainerBackend) -> list[torch.Tensor]:
    """Host tensors shaped like this rank's parameters (pinned when CUDA is available)."""
    pin = torch.cuda.is_available()
    return [torch.empty(p.shape, dtype=p.dtype, device="cpu", pin_memory=pin) for p in trainer._local_params()]


@torch.no_grad()
def snapshot_params(trainer: TorchTrainerBackend) -> None:
    """Copy the current parameters (this rank's shards) into the snapshot."""
    if trainer._snapshot is None:
        trainer._snapshot = cpu_buffers(trainer)
    for dst, src in zip(trainer._snapshot, trainer._local_params()):
        dst.copy_(src)


@contextmanager
def live_aside(trainer: TorchTrainerBackend) -> Iterator[list[torch.Tensor]]:
    """The live parameters copied aside for the block (which may overwrite them) and copied back bit-exactly."""
    if trainer._live is None:
        trainer._live = cpu_buffers(trainer)
    params = trainer._local_params()  # the same tensors back (see `swap`)
    with torch.no_grad():
        for live, p in zip(trainer._live, params):
            live.copy_(p)
    try:
        yield params
    finally:
        with torch.no_grad():
            for live, p in zip(trainer._live, params):
                p.copy_(live)


def swap(trainer: TorchTrainerBackend, to_snapshot: bool) -> None:
    """`to_snapshot`: copy the live parameters aside and the snapshot in; else copy the live ones back (exact)."""
    if to_snapshot == trainer._swapped:
        raise RuntimeError(f"the snapshot is {'already' if to_snapshot else 'not'} swapped in")
    if to_snapshot and trainer._snapshot is None:
        raise RuntimeError("no parameter snapshot: call snapshot_params() first")
    if trainer._live is None:
        trainer._live = cpu_buffers(trainer)
    # the swap back writes into the very tensors swapped in: after a forward FSDP2's root can leave its
    # parameters unsharded, so `_local_params()` asked again would return other (full-size) tensors
    params = trainer._local_params() if to_snapshot else trainer._swapped_params
    with torch.no_grad():
        for live, p, snap in zip(trainer._live, params, trainer._snapshot or trainer._live):
            if to_snapshot:
                live.copy_(p)
                p.copy_(snap)
            else:
                p.copy_(live)
    trainer._swapped = to_snapshot
    trainer._swapped_params = params if to_snapshot else None


@contextmanager
def snapshot_in(trainer: TorchTrainerBackend) -> Iterator[None]:
    """Inside the block the parameters hold the snapshot; afterwards their own values, bit-exactly."""
    swap(trainer, True)
    try:
        yield
    finally:
        swap(trainer, False)


def _sharded(trainer: TorchTrainerBackend) -> bool:
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in trainer.model.parameters())


def save_version(trainer: TorchTrainerBackend, path: str) -> None:
    """Write the snapshot θ_v into the (staging) trainer directory `path` (collective with FSDP2)."""
    from safetensors.torch import save_file

    from engine.trainer import torch_weights
    from engine.trainer.process_groups import checkpoint_barrier, checkpoint_group

    root = Path(path)
    with snapshot_in(trainer):
        if _sharded(trainer):
            import torch.distributed.checkpoint as dcp
            from torch.distributed.checkpoint.state_dict import get_model_state_dict

            dcp.save({"model": get_model_state_dict(trainer.model)}, checkpoint_id=str(root / VERSION_DCP_DIR),
                     process_group=checkpoint_group())
        else:
            weights = torch_weights.full_state_dict(trainer)
            if trainer.is_main:
                unique = {k: v.detach().contiguous().clone() for k, v in weights.items() if k not in trainer.aliases}
                save_file(unique, str(root / VERSION_FILE), metadata={"format": "pt"})
    checkpoint_barrier()


def load_version(trainer: TorchTrainerBackend, path: str) -> bool:
    """Make the snapshot θ_v of the trainer directory `path` (after `load` restored the live weights); False
    when it holds none (a checkpoint taken at a sync, or in a mode that keeps no snapshot)."""
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    from engine.trainer.process_groups import checkpoint_group

    root = Path(path)
    if (root / VERSION_DCP_DIR).is_dir():
        import torch.distributed.checkpoint as dcp

        with live_aside(trainer):
            state = {"model": get_model_state_dict(trainer.model)}
            with warnings.catch_warnings():  # one process reading a sharded checkpoint: intended
                warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process.*")
                dcp.load(state, checkpoint_id=str(root / VERSION_DCP_DIR), process_group=checkpoint_group())
            set_model_state_dict(trainer.model, state["model"])
            snapshot_params(trainer)
        return True
    if not (root / VERSION_FILE).is_file():
        return False
    options = trainer._state_dict_options(loading=True)
    with live_aside(trainer):
        weights: dict[str, torch.Tensor] = {}
        if trainer.is_main or not options.broadcast_from_rank0:
            weights = load_file(str(root / VERSION_FILE))
            for alias, canonical in trainer.aliases.items():
                weights.setdefault(alias, weights[canonical])
        set_model_state_dict(trainer.model, weights, options=options)
        snapshot_params(trainer)
    return True
