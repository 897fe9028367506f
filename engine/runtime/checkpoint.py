"""Trainer checkpoints: `<checkpoint dir>/global_step_<version>/` with the backend's weights, optimizer and RNG
states plus `state.json` (version, local step, prompt-stream position). Written to a temporary directory and
renamed into place, so a crash never leaves a half-written checkpoint under the final name."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any


def checkpoint_root(cfg: Any, run_dir: str) -> Path:
    return Path(cfg.checkpoint.dir) if cfg.checkpoint.dir else Path(run_dir) / "checkpoints"


def save_trainer_checkpoint(core: Any) -> str:
    import ray

    root = checkpoint_root(core.cfg, core.run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"global_step_{core.version}"
    tmp = root / f".tmp-global_step_{core.version}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    core.backend.save(str(tmp / "trainer"))
    state = {"version": core.version, "local_step": core.local_step, "time": time.time(),
             "stream": ray.get(core.rollouter.stream_state.remote())}
    (tmp / "state.json").write_text(json.dumps(state, indent=2))
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _prune(root, core.cfg.checkpoint.keep_last)
    return str(final)


def _prune(root: Path, keep_last: int) -> None:
    ckpts = sorted((p for p in root.glob("global_step_*") if p.is_dir()),
                   key=lambda p: int(p.name.rsplit("_", 1)[1]))
    for p in ckpts[: max(0, len(ckpts) - max(1, keep_last))]:
        shutil.rmtree(p, ignore_errors=True)
