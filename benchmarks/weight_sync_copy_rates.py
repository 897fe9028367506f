"""Per-side cost of a weight sync's copy on this host: the ways one side could move and checksum a buffer,
buffer to buffer (no model, no transport), best of 5 over 256 MiB. The pipeline's per-side work is "copy +
fused fingerprint" (`engine.sync.flat.copy_fingerprinted`): the native kernel's one pass (`engine.sync.native`,
non-temporal stores, the sums from registers) when it is built, else numpy in 256 KiB chunks; both are measured
here, with the others that bound what a change of method could gain. Run: `python -m
benchmarks.weight_sync_copy_rates` (under the heavy lock); prints one line per method.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

import engine.sync.flat as F
import engine.sync.native as native

N = 256 * 2**20


def best(fn: Any, repeats: int = 5) -> float:
    b = 1e9
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        b = min(b, time.perf_counter() - t)
    return round(N / b / 1e9, 2)


@contextlib.contextmanager
def numpy_path() -> Iterator[None]:
    """`copy_fingerprinted` / `Fingerprint.add` on their numpy path (the kernel switched off)."""
    old = os.environ.get("ASYNCRL_NATIVE")
    os.environ["ASYNCRL_NATIVE"] = "0"
    try:
        yield
    finally:
        if old is None:
            del os.environ["ASYNCRL_NATIVE"]
        else:
            os.environ["ASYNCRL_NATIVE"] = old


def two_threads(src: np.ndarray, dst: np.ndarray) -> None:
    half = N // 2

    def part(lo: int, hi: int) -> None:
        F.copy_fingerprinted(dst[lo:hi], src[lo:hi], hi - lo, F.Fingerprint(), lo, dst[lo:hi])

    ts_ = [threading.Thread(target=part, args=(0, half)), threading.Thread(target=part, args=(half, N))]
    for t in ts_:
        t.start()
    for t in ts_:
        t.join()


def read_pass(src: np.ndarray) -> None:
    fp = F.Fingerprint()
    for lo in range(0, N, 256 * 1024):
        fp.add(src[lo:lo + 256 * 1024], lo)


def main() -> None:
    src, dst = np.ones(N, np.uint8), np.zeros(N, np.uint8)
    out: dict[str, float] = {"numpy copyto (1 thread, one call)": best(lambda: np.copyto(dst, src))}
    ts, td = torch.from_numpy(src), torch.from_numpy(dst)
    threads = torch.get_num_threads()
    for th in (1, 2):
        torch.set_num_threads(th)
        out[f"torch copy_ ({th} threads, one call)"] = best(lambda: td.copy_(ts))
    torch.set_num_threads(threads)

    def fused() -> None:
        F.copy_fingerprinted(dst, src, N, F.Fingerprint(), 0, dst)

    chunk = F.CHUNK
    try:
        with numpy_path():
            for ch in (256 * 1024, 1024 * 1024, 4 * 2**20):
                def chunked(ch: int = ch) -> None:
                    for lo in range(0, N, ch):
                        np.copyto(dst[lo:lo + ch], src[lo:lo + ch])

                out[f"numpy copyto in {ch // 1024} KiB chunks"] = best(chunked)
                F.CHUNK = ch
                out[f"numpy: copy + fused fingerprint, {ch // 1024} KiB chunks"] = best(fused)
    finally:
        F.CHUNK = chunk
    with numpy_path():
        out["numpy: copy + fused fingerprint, 256 KiB chunks, 2 threads"] = best(lambda: two_threads(src, dst))
        out["numpy: fingerprint only (a read pass)"] = best(lambda: read_pass(src))
    if native.kernel() is None:
        print(f"no native kernel: {native.describe()}")
    else:
        out["native: copy + fingerprint, one pass, non-temporal stores"] = best(fused)
        nt_min = native.NT_MIN
        try:
            native.NT_MIN = N + 1
            out["native: copy + fingerprint, one pass, regular stores"] = best(fused)
        finally:
            native.NT_MIN = nt_min
        out["native: copy + fingerprint, 2 threads"] = best(lambda: two_threads(src, dst))
        out["native: fingerprint only (a read pass, one call)"] = best(lambda: F.fingerprint(ts))
        print(native.describe())
    for k, v in out.items():
        print(f"{v:6.2f} GB/s  {k}")


if __name__ == "__main__":
    main()
