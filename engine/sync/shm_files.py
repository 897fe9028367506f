"""The files of the shared-memory weight sync (`engine.sync.shared_memory`): their names and control page,
creating and mapping them, a process's liveness, and the sweep of files whose sender is gone.

A ring epoch is `SLOTS` files `/dev/shm/asyncrl-<run>-p<sender pid>-e<epoch>-s<slot>` plus a control page
(`...-sc`, `CONTROL_WORDS` int64 words: receiver acknowledgements, then receiver pids from `PID_WORDS`), created
0600 and fully reserved up front (`posix_fallocate`: a full /dev/shm fails at creation, not mid-sync).
"""

from __future__ import annotations

import glob
import mmap
import os
import re
import warnings

import numpy as np
import torch

from engine.sync.flat import ALIGN

SHM_DIR = "/dev/shm"
CONTROL_WORDS = 512
"""Words of the control page (one 4 KiB page): word r is receiver rank r's acknowledgement (rank 0 is the sender),
word `PID_WORDS` + r its process id (written when it maps the ring: the sender's liveness check)."""
PID_WORDS = CONTROL_WORDS // 2
_FILE = re.compile(r"^asyncrl-.+-p(?P<pid>\d+)-e\d+-s(\d+|c)$")


def _unlink(paths: list[str]) -> None:
    for p in paths:
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass


def sweep_stale(directory: str = SHM_DIR) -> list[str]:
    """Remove ring files of this scheme whose sender process no longer exists on this host (a sender killed
    before its first sync completed); returns the paths removed."""
    removed = []
    for path in glob.glob(os.path.join(directory, "asyncrl-*-p*-e*-s*")):
        m = _FILE.match(os.path.basename(path))
        if m is None:
            continue
        try:
            os.kill(int(m["pid"]), 0)
        except ProcessLookupError:
            _unlink([path])
            removed.append(path)
        except PermissionError:  # another user's live process
            pass
    return removed


def _alive(pid: int) -> bool:
    """Whether process `pid` runs on this host (a zombie counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def _create(path: str, size: int) -> torch.Tensor:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError as e:
            _unlink([path])
            raise RuntimeError(f"shared-memory weight sync: cannot reserve {size / 2**20:.0f} MiB in "
                               f"{os.path.dirname(path)} ({e.strerror}); free space there or set "
                               'rollout.weight_sync = "collective"') from None
        mm = mmap.mmap(fd, size)
    finally:
        os.close(fd)
    return torch.from_numpy(np.frombuffer(mm, dtype=np.uint8))


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


_MAPPED: dict[str, tuple[list[torch.Tensor], np.ndarray]] = {}
"""This process's mapping of the newest ring epoch it saw, by epoch name (older epochs are dropped): its slots
(read-only) and its control page's words (read-write: this receiver's acknowledgements)."""


def _open(path: str, size: int, writable: bool) -> mmap.mmap:
    try:
        fd = os.open(path, os.O_RDWR if writable else os.O_RDONLY)
    except FileNotFoundError:
        raise RuntimeError(f"shared-memory weight sync: {path} is not on this host: every rollout replica "
                           'must run on the trainer\'s host (set rollout.weight_sync = "collective")') from None
    try:
        return mmap.mmap(fd, size, prot=mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0))
    finally:
        os.close(fd)


def _map(ring: tuple[str, list[str], int, str]) -> tuple[list[torch.Tensor], np.ndarray]:
    name, paths, size, ctrl_path = ring
    mapped = _MAPPED.get(name)
    if mapped is None:
        _MAPPED.clear()
        slots = []
        for p in paths:
            mm = _open(p, size, False)
            with warnings.catch_warnings():  # read-only: the receivers only read the slots
                warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
                slots.append(torch.from_numpy(np.frombuffer(mm, dtype=np.uint8)))
        ctrl = np.frombuffer(_open(ctrl_path, CONTROL_WORDS * 8, True), dtype=np.int64)
        mapped = _MAPPED[name] = (slots, ctrl)
    return mapped
