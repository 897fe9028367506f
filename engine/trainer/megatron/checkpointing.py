"""Checkpoint directory of the Megatron backend (same top-level layout as the torch backend's).

    path/model.safetensors          full weights in HF names (gathered from all TP/EP ranks; re-shardable,
                                    readable by the torch backend and by vLLM)
    path/trainer_state.json         optimizer step, base learning rate, parallel layout
    path/optimizer_rank{r}.pt       rank r's optimizer state (its own shards; needs the same layout)
    path/prox_rank{r}.pt            rank r's proximal snapshot (decoupled mode), when one was taken
    path/rng_rank{r}.pt             python / numpy / torch / CUDA RNG states + Megatron's RNG tracker states

Rank 0 creates a staging directory, every rank writes its files, rank 0 publishes it atomically
(`engine.trainer.checkpoint.publish`). The HF weights are gathered tensor by tensor (a collective every rank
joins) but kept on the host by rank 0 alone; the barriers wait on `process_groups.checkpoint_group` (gloo, a
timeout that covers rank 0's write), not on the device group's 300 s. Saving reads the *live* parameters and never the proximal
snapshot buffers, so it works in decoupled mode at any point (verl #6026 broke exactly there).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import save_file

from engine.trainer import checkpoint as ckpt
from engine.trainer.megatron.convert import SafetensorsSource
from engine.trainer.megatron.export import iter_hf_tensors
from engine.trainer.process_groups import checkpoint_barrier

if TYPE_CHECKING:
    from engine.trainer.megatron.backend import MegatronTrainerBackend


def optimizer_file(rank: int) -> str:
    return f"optimizer_rank{rank}.pt"


def prox_file(rank: int) -> str:
    return f"prox_rank{rank}.pt"


def capture_rng_with_tracker() -> dict[str, Any]:
    """`checkpoint.capture_rng()` plus the named states of Megatron's model-parallel RNG tracker."""
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    state = ckpt.capture_rng()
    state["megatron_tracker"] = {k: v.clone() for k, v in get_cuda_rng_tracker().get_states().items()}
    return state


def restore_rng_with_tracker(state: dict[str, Any]) -> None:
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    ckpt.restore_rng(state)
    tracker = state.get("megatron_tracker")
    if tracker:
        get_cuda_rng_tracker().set_states({k: v.clone() for k, v in tracker.items()})


def staging_path(path: str | Path, step: int) -> Path:
    return Path(f"{str(path).rstrip('/')}.tmp-step{step}")


def _layout(backend: MegatronTrainerBackend) -> list[int]:
    lay = backend.layout
    uneven = [lay.first_stage_layers, lay.last_stage_layers]  # an optimizer shard holds its stage's layers
    return [lay.tp, lay.pp, lay.cp, lay.ep, lay.world_size] + (uneven if any(n is not None for n in uneven) else [])


def save_backend(backend: MegatronTrainerBackend, path: str) -> None:
    """Write the checkpoint directory `path` (collective: every rank calls it)."""
    weights: dict[str, torch.Tensor] = {}
    for name, t in iter_hf_tensors(backend.model, backend.arch, to_sender=backend.layout.pp == 1):  # collective
        if backend.is_main:  # only the writer keeps the full weights on the host
            weights[name] = t.detach().cpu().clone()
    if backend.arch.tie_word_embeddings:
        weights.pop("lm_head.weight", None)
    rank = backend.rank
    staging = ckpt.staging_dir(path, f"step{backend.global_step}") if backend.is_main else None
    checkpoint_barrier()
    staging = staging or staging_path(path, backend.global_step)
    if backend.is_main:
        save_file({k: v.contiguous() for k, v in weights.items()}, str(staging / ckpt.MODEL_FILE),
                  metadata={"format": "pt"})
        state = {"global_step": backend.global_step, "base_lr": backend.base_lr, "backend": "megatron",
                 "layout": _layout(backend)}
        (staging / ckpt.STATE_FILE).write_text(json.dumps(state))
    torch.save(backend.optimizer.state_dict(), staging / optimizer_file(rank))
    backend.optimizer.save_extra(str(staging / f"optimizer_params_rank{rank}.pt"))
    if backend.snapshot.taken:
        torch.save({"version": backend.snapshot.version, "tensors": backend.snapshot.state()},
                   staging / prox_file(rank))
    torch.save(capture_rng_with_tracker(), staging / ckpt.rng_file(rank))
    checkpoint_barrier()
    if backend.is_main:
        ckpt.publish(staging, path)
    checkpoint_barrier()


def load_backend(backend: MegatronTrainerBackend, path: str) -> None:
    """Restore a directory written by `save_backend` into `backend` (collective)."""
    root = Path(path)
    rank = backend.rank
    state = json.loads((root / ckpt.STATE_FILE).read_text())
    if state.get("layout") != _layout(backend):
        raise ValueError(f"checkpoint layout (tp, pp, cp, ep, world[, first / last stage layers]) "
                         f"{state.get('layout')} != {_layout(backend)}")
    backend.load_hf_weights(SafetensorsSource(root))
    backend.optimizer.load_state_dict(torch.load(root / optimizer_file(rank), map_location="cpu", weights_only=False))
    backend.optimizer.load_extra(str(root / f"optimizer_params_rank{rank}.pt"))
    prox = root / prox_file(rank)
    if prox.exists():
        saved = torch.load(prox, map_location="cpu", weights_only=False)
        backend.snapshot.restore_state(saved["tensors"])
        backend.snapshot.version = int(saved["version"])
    else:
        backend.snapshot.clear()
    backend.global_step = int(state["global_step"])
    backend.base_lr = float(state["base_lr"])
    rng = root / ckpt.rng_file(rank)
    if rng.exists():
        restore_rng_with_tracker(torch.load(rng, map_location="cpu", weights_only=False))
    backend.barrier()
