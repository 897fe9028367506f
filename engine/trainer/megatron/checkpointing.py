"""Checkpoint directory of the Megatron backend (same top-level layout as the torch backend's).

    path/model.safetensors          full weights in HF names (gathered from all TP/EP ranks; re-shardable,
                                    readable by the torch backend and by vLLM)
    path/trainer_state.json         optimizer step, base learning rate, parallel layout
    path/optimizer_rank{r}.pt       rank r's optimizer state (its own shards; needs the same layout)
    path/prox_rank{r}.pt            rank r's proximal snapshot (decoupled mode), when one was taken
    path/rng_rank{r}.pt             python / numpy / torch / CUDA RNG states + Megatron's RNG tracker states

Rank 0 creates a staging directory, every rank writes its files, rank 0 publishes it atomically
(`engine.trainer.checkpoint.publish`). Saving reads the *live* parameters and never the proximal
snapshot buffers, so it works in decoupled mode at any point (verl #6026 broke exactly there).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from engine.trainer import checkpoint as ckpt


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
