"""Per-side cost of a weight sync's copy on this host: the ways one side could move and checksum a buffer,
buffer to buffer (no model, no transport), best of 5 over 256 MiB. The pipeline's per-side work is "copy +
fused fingerprint, 256 KiB chunks" (`engine.sync.flat.copy_fingerprinted`); the others bound what a change
of method could gain. Run: `python -m benchmarks.weight_sync_copy_rates` (under the heavy lock); prints one
line per method.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import torch

import engine.sync.flat as F

N = 256 * 2**20


def best(fn: Any, repeats: int = 5) -> float:
    b = 1e9
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        b = min(b, time.perf_counter() - t)
    return round(N / b / 1e9, 2)


def main() -> None:
    src, dst = np.ones(N, np.uint8), np.zeros(N, np.uint8)
    out: dict[str, float] = {"numpy copyto (1 thread, one call)": best(lambda: np.copyto(dst, src))}
    ts, td = torch.from_numpy(src), torch.from_numpy(dst)
    threads = torch.get_num_threads()
    for th in (1, 2):
        torch.set_num_threads(th)
        out[f"torch copy_ ({th} threads, one call)"] = best(lambda: td.copy_(ts))
    torch.set_num_threads(threads)
    chunk = F.CHUNK
    try:
        for ch in (256 * 1024, 1024 * 1024, 4 * 2**20):
            def chunked(ch: int = ch) -> None:
                for lo in range(0, N, ch):
                    np.copyto(dst[lo:lo + ch], src[lo:lo + ch])

            def fused() -> None:
                F.copy_fingerprinted(dst, src, N, F.Fingerprint(), 0, dst)

            out[f"numpy copyto in {ch // 1024} KiB chunks"] = best(chunked)
            F.CHUNK = ch
            out[f"copy + fused fingerprint, {ch // 1024} KiB chunks"] = best(fused)
    finally:
        F.CHUNK = chunk

    def two_threads() -> None:
        half = N // 2

        def part(lo: int, hi: int) -> None:
            F.copy_fingerprinted(dst[lo:hi], src[lo:hi], hi - lo, F.Fingerprint(), lo, dst[lo:hi])

        ts_ = [threading.Thread(target=part, args=(0, half)), threading.Thread(target=part, args=(half, N))]
        for t in ts_:
            t.start()
        for t in ts_:
            t.join()

    out["copy + fused fingerprint, 256 KiB chunks, 2 threads"] = best(two_threads)

    def read_pass() -> None:
        fp = F.Fingerprint()
        for lo in range(0, N, 256 * 1024):
            fp.add(src[lo:lo + 256 * 1024], lo)

    out["fingerprint only (a read pass)"] = best(read_pass)
    for k, v in out.items():
        print(f"{v:6.2f} GB/s  {k}")


if __name__ == "__main__":
    main()
