"""Trainer checkpoint directory: layout, RNG capture, and the atomic publish.

    path/model.safetensors     full weights in HF names (tied aliases such as lm_head.weight stored once)
    path/optimizer.pt          optimizer state keyed by parameter name (torch.distributed.checkpoint format)
    path/trainer_state.json    optimizer step, base learning rate
    path/rng_rank{r}.pt        python / numpy / torch (CPU and CUDA) RNG states of rank r
    path/version.safetensors   taken between two syncs: the version's weights, the snapshot of the last sync
                               (`engine.trainer.version_weights`; FSDP2: `version_dcp/`, and `dcp/` for the rest)

Everything is written into `path.tmp-<token>` first; `publish` then swaps it into place with renames, so
a crash never leaves a half-written `path`.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engine.persist.atomic import publish_dir

MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.pt"
STATE_FILE = "trainer_state.json"


def rng_file(rank: int) -> str:
    return f"rng_rank{rank}.pt"


def capture_rng() -> dict[str, Any]:
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def staging_dir(path: str | os.PathLike[str], token: str) -> Path:
    """A fresh sibling directory to write the checkpoint into before `publish`."""
    staging = Path(f"{os.fspath(path).rstrip('/')}.tmp-{token}")
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    return staging


def publish(staging: Path, path: str | os.PathLike[str]) -> None:
    """Atomically replace `path` by the complete `staging` directory (`engine.persist.atomic.publish_dir`)."""
    publish_dir(staging, path)
