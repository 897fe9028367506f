"""The host weight-sync path's native kernel: copy + delivery fingerprint in one pass (`fused_copy.c`).

`engine.sync.flat.copy_fingerprinted`, `Fingerprint.add` and the host `fingerprint` call it when it is loaded:
one pass over the bytes that copies with non-temporal stores (no read-for-ownership of the destination, what
glibc's `memcpy` does for large copies) and sums the words from the registers they were loaded into — the same
fingerprint as the numpy path, bit for bit (tests/sync/test_native_kernel.py). ctypes releases the GIL for the
call, so a pipeline's threads overlap.

Built on first use with the system C compiler (`$CC`, else `cc`/`gcc`/`clang`: `-O3 -march=native -shared
-fPIC`), cached per user in `$XDG_CACHE_HOME/asyncrl/native/` (default `~/.cache/...`) under a name that hashes
the source, the compiler's version, the machine and its CPU flags (a home directory shared by different CPUs
gets one build each), renamed into place atomically (concurrent first uses are safe), and checked against the
numpy path on a small buffer before use. No compiler, a failed build or check, or `ASYNCRL_NATIVE=0` → None:
the callers keep the numpy path (logged once), never an error.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any

import numpy as np

SOURCE = Path(__file__).with_name("fused_copy.c")
ABI = 3
NT_MIN = 256 * 1024
"""Copies of at least this many bytes stream their stores past the cache (smaller ones stay cached)."""
_FLAGS = ["-O3", "-march=native", "-shared", "-fPIC"]
_log = logging.getLogger(__name__)
_lock = threading.Lock()
_state: dict[str, Any] = {}


def enabled() -> bool:
    """False when `ASYNCRL_NATIVE` is 0/false/no/off (the numpy path then, whatever is built)."""
    return os.environ.get("ASYNCRL_NATIVE", "1").strip().lower() not in ("0", "false", "no", "off")


def kernel() -> Any | None:
    """The loaded library, or None (disabled, no compiler, failed build or self-check)."""
    if not enabled():
        return None
    if "lib" not in _state:
        with _lock:
            if "lib" not in _state:
                _state["lib"] = _load()
    return _state["lib"]


def describe() -> str:
    """One line for logs and benchmarks: the kernel's ISA and file, or why the numpy path is used."""
    lib = kernel()
    if lib is None:
        return "numpy (ASYNCRL_NATIVE=0)" if not enabled() else f"numpy ({_state.get('why', 'not built')})"
    return f"native {lib.asyncrl_native_isa().decode()} ({_state.get('path')})"


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "asyncrl" / "native"


def _compiler() -> str | None:
    cc = os.environ.get("CC")
    if cc:
        return shutil.which(cc)
    for name in ("cc", "gcc", "clang"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return line
    except OSError:
        pass
    return platform.processor()


def _fail(why: str) -> None:
    _state["why"] = why
    _log.info("asyncrl native copy kernel not used (%s): the numpy path copies and fingerprints", why)
    return None


def _load() -> Any | None:
    cc = _compiler()
    if cc is None:
        return _fail("no C compiler found")
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as e:
        return _fail(f"{cc} --version failed: {e}")
    source = SOURCE.read_bytes()
    key = hashlib.sha256(b"\0".join([source, version.encode(), platform.machine().encode(),
                                     _cpu_flags().encode(), " ".join(_FLAGS).encode()])).hexdigest()[:20]
    path = _build(cc, key)
    if path is None:
        return None
    try:
        lib = ctypes.CDLL(str(path))
        if lib.asyncrl_native_abi() != ABI:
            return _fail(f"{path} has another ABI")
    except (OSError, AttributeError) as e:
        return _fail(f"cannot load {path}: {e}")
    u64p = ctypes.POINTER(ctypes.c_uint64)
    lib.asyncrl_copy_fp.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                                    ctypes.c_size_t, ctypes.c_uint64, ctypes.c_int, u64p]
    lib.asyncrl_copy_fp.restype = None
    lib.asyncrl_sum_fp.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint64, u64p]
    lib.asyncrl_sum_fp.restype = None
    lib.asyncrl_copy_fp_batch.argtypes = [ctypes.c_size_t, u64p, u64p, u64p, u64p, u64p, u64p, ctypes.c_size_t,
                                          ctypes.c_int, u64p]
    lib.asyncrl_copy_fp_batch.restype = None
    lib.asyncrl_copy_fp_sample_batch.argtypes = [ctypes.c_size_t, u64p, u64p, u64p, u64p, u64p, u64p,
                                                 ctypes.c_size_t, ctypes.c_int, ctypes.c_size_t, u64p, u64p]
    lib.asyncrl_copy_fp_sample_batch.restype = None
    lib.asyncrl_native_isa.restype = ctypes.c_char_p
    if not _self_check(lib):
        return _fail(f"{path} disagrees with the numpy fingerprint")
    _state["path"] = str(path)
    _log.debug("asyncrl native copy kernel: %s (%s)", path, lib.asyncrl_native_isa().decode())
    return lib


def _build(cc: str, key: str) -> Path | None:
    """The cached library for `key`, compiled if absent (into a private temporary file, then renamed)."""
    directory = _cache_dir()
    path = directory / f"fused_copy-{key}.so"
    if path.exists():
        return path
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".fused_copy-", suffix=".so", dir=directory)
    except OSError:  # an unwritable cache: build into a temporary directory, not cached
        directory = Path(tempfile.mkdtemp(prefix="asyncrl-native-"))
        path = directory / f"fused_copy-{key}.so"
        fd, tmp = tempfile.mkstemp(prefix=".fused_copy-", suffix=".so", dir=directory)
    os.close(fd)
    try:
        err = ""
        for flags in (_FLAGS, [f for f in _FLAGS if f != "-march=native"]):  # a compiler without -march=native
            try:
                r = subprocess.run([cc, *flags, "-o", tmp, str(SOURCE)], capture_output=True, text=True,
                                   timeout=300)
            except (OSError, subprocess.SubprocessError) as e:
                err = str(e)
                continue
            if r.returncode == 0:
                os.replace(tmp, path)
                return path
            err = (r.stderr or r.stdout).strip().splitlines()[-1:] or [f"exit {r.returncode}"]
            err = err[0]
        return _fail(f"{cc} failed: {err}")
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _check_sums(region: np.ndarray, at: int) -> tuple[int, int]:
    words = region.view("<u8")
    return int(words.sum()) & (2**64 - 1), int(words[(-(at // 8)) % 7::7].sum()) & (2**64 - 1)


def _self_check(lib: Any) -> bool:
    rng = np.random.default_rng(0)
    src = rng.integers(0, 256, 4096 + 77, dtype=np.uint8)
    dst = np.zeros(8192, np.uint8)
    for off, n, at in ((0, 4096, 0), (8, 3000 + 3, 8 * 13), (3, 2049, 56 * 5 + 24)):
        s, d = src[off:off + n], dst[64 + off:64 + off + (n + 7) // 8 * 8]
        d[:] = 0
        out = (ctypes.c_uint64 * 2)()
        lib.asyncrl_copy_fp(d.ctypes.data, s.ctypes.data, n, d.ctypes.data, d.size, at // 8, 1, out)
        if not np.array_equal(d[:n], s) or (out[0], out[1]) != _check_sums(d, at):
            return False
    return True


def _ptr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def _flat_bytes(a: Any) -> bool:
    return isinstance(a, np.ndarray) and a.dtype == np.uint8 and a.ndim == 1 and a.flags.c_contiguous


def copy_fp(dst: Any, src: Any, n: int, seen: Any, at: int) -> tuple[int, int] | None:
    """`engine.sync.flat.copy_fingerprinted`'s work in one call: copies min(n, seen.size) bytes and returns the
    fingerprint's (total, strided) sums of `seen` (mod 2^64); None when the kernel is not loaded or the
    arguments are not what it takes (numpy uint8 1-d contiguous, seen a multiple of 8 bytes and `dst` or `src`
    when anything is copied) — the caller then takes the numpy path."""
    lib = kernel()
    if lib is None or not _flat_bytes(seen) or seen.size % 8:
        return None
    n = max(0, min(n, seen.size))
    if n:
        if not (_flat_bytes(dst) and _flat_bytes(src)) or dst.size < n or src.size < n \
                or not dst.flags.writeable:
            return None
        d, s, v = _ptr(dst), _ptr(src), _ptr(seen)
        if v != d and v != s:
            return None
    else:
        d = s = 0
    out = (ctypes.c_uint64 * 2)()
    lib.asyncrl_copy_fp(d, s, n, _ptr(seen), seen.size, at // 8, 1 if n >= NT_MIN else 0, out)
    return out[0], out[1]


def copy_fp_batch(regions: list[tuple[int, int, int, int, int, int]], zero_pad: bool = False) \
        -> tuple[int, int] | None:
    """Many `copy_fp`s in one call, by address: each region (dst, src, n, seen, seen_len, at) copies `n` bytes
    from address `src` to `dst` (dst 0 and n 0: sums only) and adds the sums of the `seen_len` bytes at `seen`,
    the buffer's byte `at` (`seen_len` and `at` multiples of 8; `seen` is `dst` or `src`); with `zero_pad`
    each dst's bytes n … seen_len are zeroed first (the sender's padding). Returns the sums of all regions
    together, or None when the kernel is not loaded. The caller guarantees the addresses: nothing is checked
    here (`engine.sync.apply.load_flat`, `engine.sync.flat` build them from tensors they bounds-checked)."""
    out = _batch(regions, zero_pad, 0)
    return None if out is None else out[:2]


def copy_fp_batch_sampled(regions: list[tuple[int, int, int, int, int, int]], stride: int) \
        -> tuple[int, int, list[int]] | None:
    """`copy_fp_batch`, plus for each region the sum of the copied bytes 0, `stride`, 2·`stride`, … below `n`
    (0 where nothing is copied): `engine.sync.verify.weights_fingerprint`'s sum of the destination tensor,
    read back from the cache right after each ~900 KiB of the copy instead of from memory after it."""
    return _batch(regions, False, max(1, int(stride)))


def _batch(regions: list[tuple[int, int, int, int, int, int]], zero_pad: bool, stride: int) \
        -> tuple[int, int, list[int]] | None:
    lib = kernel()
    if lib is None:
        return None
    count = len(regions)
    out = (ctypes.c_uint64 * 2)()
    if not count:
        return 0, 0, []
    cols = np.array(regions, dtype=np.uint64).reshape(count, 6)
    cols[:, 5] //= np.uint64(8)
    arrays = [np.ascontiguousarray(cols[:, j]) for j in range(6)]
    u64p = ctypes.POINTER(ctypes.c_uint64)
    ptrs = [a.ctypes.data_as(u64p) for a in arrays]
    if not stride:
        lib.asyncrl_copy_fp_batch(count, *ptrs, NT_MIN, 1 if zero_pad else 0, out)
        return out[0], out[1], []
    samples = np.zeros(count, dtype=np.uint64)
    lib.asyncrl_copy_fp_sample_batch(count, *ptrs, NT_MIN, 1 if zero_pad else 0, stride,
                                     samples.ctypes.data_as(u64p), out)
    return out[0], out[1], samples.tolist()


def sum_fp(region: Any, at: int) -> tuple[int, int] | None:
    """`Fingerprint.add`'s two sums of `region` starting at byte `at`; None as for `copy_fp`."""
    lib = kernel()
    if lib is None or not _flat_bytes(region) or region.size % 8:
        return None
    out = (ctypes.c_uint64 * 2)()
    lib.asyncrl_sum_fp(_ptr(region), region.size, at // 8, out)
    return out[0], out[1]
