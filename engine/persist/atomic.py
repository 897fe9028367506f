"""The one atomic writer: a reader sees the old content or the new one, never a torn file or directory.

A file: the bytes go to a temporary file in the same directory (`.<name>.<pid>.<thread>.tmp`, so concurrent
writers never share one), which is flushed and fsynced, then `os.replace`d onto `path` (an atomic rename on
POSIX filesystems), and the directory is fsynced so the new name survives a power cut. A failure removes the
temporary file and leaves `path` as it was.

A directory (`publish_dir`): it is written in full under a staging name first (`fsync_tree` makes its files and
names durable), then the existing directory of the final name, if any, is renamed aside, the staging one renamed
in, the parent fsynced and the old one deleted. Between the two renames the final name is briefly absent (a
directory cannot be swapped over a non-empty one in one call); a crash there leaves the old copy under
`.old-<name>-<pid>` and the new one under its staging name, both complete.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path
from typing import Any


def fsync_path(path: str | os.PathLike[str]) -> None:
    """fsync one file or directory (its data, or for a directory its entries)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: str | os.PathLike[str]) -> None:
    """fsync every file under `root`, then every directory bottom-up (so the names are durable too)."""
    root = Path(root)
    for p in root.rglob("*"):
        if p.is_file():
            fsync_path(p)
    for d in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        fsync_path(d)
    fsync_path(root)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Replace the file `path` by `data` atomically and durably (module docstring); parents are created."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with tmp.open("wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_path(path.parent)


def atomic_write_text(path: str | os.PathLike[str], text: str, encoding: str = "utf-8") -> None:
    """`atomic_write_bytes` of `text` encoded."""
    atomic_write_bytes(path, text.encode(encoding))


def atomic_write_json(path: str | os.PathLike[str], obj: Any, indent: int | None = 2) -> None:
    """`atomic_write_text` of `obj` as JSON (`indent` spaces, a final newline)."""
    atomic_write_text(path, json.dumps(obj, indent=indent) + "\n")


def publish_dir(staging: str | os.PathLike[str], final: str | os.PathLike[str]) -> None:
    """Move the complete directory `staging` to `final`, replacing an existing `final` (module docstring). The
    caller fsyncs the staging tree first when its files must survive a power cut (`fsync_tree`)."""
    staging, final = Path(staging), Path(final)
    old = final.with_name(f".old-{final.name}-{os.getpid()}")
    if old.exists():
        shutil.rmtree(old)
    if final.exists():
        os.replace(final, old)
    os.replace(staging, final)
    fsync_path(final.parent)
    shutil.rmtree(old, ignore_errors=True)
