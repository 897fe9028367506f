"""The user's model cache (`$ASYNCRL_CACHE`, default `~/.cache/asyncrl`) and build-once-atomically.

Several processes (trainer ranks, rollout replicas) may ask for the same built model at the same time:
`build_once` serialises them with an exclusive `flock` on `<target>.lock`, builds into a temporary sibling
directory and renames it into place, so a reader sees either no directory or a complete one.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def default_cache_dir() -> Path:
    """`$ASYNCRL_CACHE` if set, else `~/.cache/asyncrl`."""
    return Path(os.environ.get("ASYNCRL_CACHE") or "~/.cache/asyncrl").expanduser()


def build_once(target: Path, builder: Callable[[Path], None]) -> Path:
    """Return `target`, first running `builder(tmp_dir)` and renaming `tmp_dir` to `target` if it is
    missing. Safe across processes; a failed build leaves nothing behind."""
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    lock_path = target.parent / f".{target.name}.lock"
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if target.is_dir():
                return target
            tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
            try:
                builder(tmp)
                os.rename(tmp, target)
            finally:
                if tmp.exists():
                    shutil.rmtree(tmp, ignore_errors=True)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return target
