"""The native copy + fingerprint kernel (engine.sync.native): the same fingerprint as the numpy path, bit for bit,
an exact copy, and the numpy path when it is switched off or cannot be built."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import engine.sync.native as native
from engine.sync.apply import load_buckets_into
from engine.sync.flat import Fingerprint, copy_fingerprinted, fingerprint, flatten, host_bytes

needs_kernel = pytest.mark.skipif(native.kernel() is None, reason=f"no native kernel here: {native.describe()}")


def numpy_fp(fn, monkeypatch):
    """`fn()` run on the numpy path (ASYNCRL_NATIVE=0)."""
    with monkeypatch.context() as m:
        m.setenv("ASYNCRL_NATIVE", "0")
        assert native.kernel() is None
        return fn()


def ref_copy(dst, src, n, at, seen_is_dst, monkeypatch):
    d = dst.copy()
    fp = Fingerprint()
    numpy_fp(lambda: copy_fingerprinted(d, src, n, fp, at, d if seen_is_dst else src), monkeypatch)
    return d, fp.value


SUPER = 8 * 7 * 4096  # the kernel's interleaved superblock (8 streams of 7 pages): exact multiples and remainders
LENGTHS = [0, 8, 16, 48, 56, 64, 440, 448, 456, 896 + 40, 4096, 65536 + 8 * 13, 300_000, 2**20 + 8 * 5]


@needs_kernel
@pytest.mark.parametrize("size", LENGTHS)
@pytest.mark.parametrize("at", [0, 8, 48, 56, 64 * 7, 8 * 1001])
def test_sum_matches_numpy(size, at, monkeypatch):
    rng = np.random.default_rng(size + at)
    buf = rng.integers(0, 256, size + 64, dtype=np.uint8)
    for off in (0, 8, 24, 1):  # aligned and unaligned starts
        region = buf[off:off + size]
        fp = Fingerprint()
        fp.add(region, at)
        ref = Fingerprint()
        numpy_fp(lambda: ref.add(region, at), monkeypatch)
        assert fp.value == ref.value, (size, at, off)


@needs_kernel
@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 63, 64, 65, 447, 449, 1000, 4099, 262_144 + 3, 2**20 + 5,
                               2 * SUPER, 3 * SUPER + 8 * 13 + 5, 3 * SUPER - 8])
@pytest.mark.parametrize("at", [0, 8, 56 * 3, 8 * 1003])
@pytest.mark.parametrize("seen_is_dst", [True, False])
def test_copy_matches_numpy(n, at, seen_is_dst, monkeypatch):
    rng = np.random.default_rng(n * 31 + at)
    pad = 64 + (-n) % 8  # seen covers the copy and padding beyond it, a multiple of 8
    for doff, soff in ((0, 0), (8, 16), (3, 5), (64, 1)):  # dst aligned, 8-aligned, unaligned
        dst_buf = rng.integers(0, 256, n + pad + 128, dtype=np.uint8)
        src_buf = rng.integers(0, 256, n + pad + 128, dtype=np.uint8)
        dst, src = dst_buf[doff:doff + n + pad], src_buf[soff:soff + n + pad]
        want, want_fp = ref_copy(dst, src, n, at, seen_is_dst, monkeypatch)
        fp = Fingerprint()
        copy_fingerprinted(dst, src, n, fp, at, dst if seen_is_dst else src)
        assert np.array_equal(dst, want), (n, at, doff, soff)  # the copy is exact, the padding untouched
        assert np.array_equal(dst[:n], src[:n])
        assert fp.value == want_fp, (n, at, doff, soff, seen_is_dst)


@needs_kernel
def test_kernel_is_what_runs(monkeypatch):
    """With the kernel loaded, copy_fingerprinted does not touch numpy's copyto (one native call)."""
    def boom(*a, **k):
        raise AssertionError("numpy path taken")

    monkeypatch.setattr(np, "copyto", boom)
    src = np.arange(4096, dtype=np.uint8)
    dst = np.zeros(4096, np.uint8)
    copy_fingerprinted(dst, src, 4096, Fingerprint(), 0, dst)
    assert np.array_equal(dst, src)
    assert native.describe().startswith("native")


def test_switched_off_takes_numpy(monkeypatch):
    monkeypatch.setenv("ASYNCRL_NATIVE", "0")
    assert native.kernel() is None and native.describe() == "numpy (ASYNCRL_NATIVE=0)"
    calls = []
    real = np.copyto
    monkeypatch.setattr(np, "copyto", lambda *a, **k: (calls.append(1), real(*a, **k)))
    src = np.arange(4096, dtype=np.uint8)
    dst = np.zeros(4096, np.uint8)
    copy_fingerprinted(dst, src, 4096, Fingerprint(), 0, dst)
    assert calls and np.array_equal(dst, src)


def test_no_compiler_falls_back(monkeypatch, tmp_path, caplog):
    """A missing compiler is no error: the kernel is None, the reason logged once, the sync path still works."""
    monkeypatch.setattr(native, "_state", {})
    monkeypatch.delenv("ASYNCRL_NATIVE", raising=False)
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with caplog.at_level("INFO", logger="engine.sync.native"):
        assert native.kernel() is None
        assert native.kernel() is None
    assert [r.message for r in caplog.records].count(caplog.records[0].message) == 1
    assert "no C compiler" in native.describe()
    t = torch.randn(1000, dtype=torch.bfloat16)
    fb = flatten({"w": t})
    assert fb.fingerprint == fingerprint(fb.data)


def test_failed_build_falls_back(monkeypatch, tmp_path):
    """A compiler that fails (here: `false`) leaves the numpy path and nothing half-written in the cache."""
    monkeypatch.setattr(native, "_state", {})
    monkeypatch.delenv("ASYNCRL_NATIVE", raising=False)
    monkeypatch.setenv("CC", "false")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert native.kernel() is None
    assert "failed" in native.describe()
    assert not any(p.suffix == ".so" for p in (tmp_path / "asyncrl" / "native").iterdir())


@needs_kernel
def test_built_once_and_cached(monkeypatch, tmp_path):
    """The first use compiles into the per-user cache; a fresh process state loads the same file."""
    monkeypatch.setattr(native, "_state", {})
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert native.kernel() is not None
    built = sorted((tmp_path / "asyncrl" / "native").glob("fused_copy-*.so"))
    assert len(built) == 1
    mtime = built[0].stat().st_mtime_ns
    monkeypatch.setattr(native, "_state", {})
    assert native.kernel() is not None
    assert built[0].stat().st_mtime_ns == mtime
    assert sorted((tmp_path / "asyncrl" / "native").iterdir()) == built  # no temporary file left


@needs_kernel
def test_pack_and_load_same_fingerprint_both_ways(monkeypatch):
    """A bucket packed and loaded with the kernel has the numpy path's fingerprint; odd sizes (padding)."""
    torch.manual_seed(0)
    model = torch.nn.ModuleDict({"a": torch.nn.Linear(37, 11), "b": torch.nn.Embedding(13, 7)}).to(torch.bfloat16)
    sd = {k: torch.randn_like(v) for k, v in model.state_dict().items()}
    fb = flatten(sd)
    ref = numpy_fp(lambda: flatten(sd), monkeypatch)
    assert fb.fingerprint == ref.fingerprint
    assert torch.equal(fb.data, ref.data)
    from engine.sync.flat import FlatBucket
    recv = FlatBucket(fb.index, fb.data.clone(), 0)
    load_buckets_into(model, [recv])
    assert recv.fingerprint == fb.fingerprint
    for k, v in model.state_dict().items():
        assert torch.equal(v, sd[k])
    # a corrupted byte changes the receiver's fingerprint, on both paths
    bad = fb.data.clone()
    host_bytes(bad)[5] ^= 1
    got = FlatBucket(fb.index, bad, 0)
    load_buckets_into(model, [got])
    assert got.fingerprint != fb.fingerprint
    assert numpy_fp(lambda: fingerprint(bad), monkeypatch) == got.fingerprint


def _mixed_bucket() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return {"tiny": torch.randn(3, generator=g).to(torch.bfloat16),  # 6 bytes: padded to 64
            "empty": torch.zeros(0),
            "w": torch.randn(300, 700, generator=g),  # 840 000 bytes: streamed stores (≥ NT_MIN)
            "strided": torch.randn(40, 30, generator=g).t(),  # not contiguous on the sender
            "ints": torch.randint(-9, 9, (13, 7), generator=g, dtype=torch.int32),
            "half": torch.randn(17, generator=g).half()}


@needs_kernel
def test_a_bucket_packed_in_one_native_call_equals_the_numpy_pack(monkeypatch):
    """The sender's batched pack (padding zeroed in the kernel, into a dirty reused buffer) writes the same
    bytes and fingerprint as the numpy path, tensor by tensor."""
    from engine.sync.flat import BufferRing

    class Dirty(BufferRing):  # a reused slot full of an earlier bucket's bytes
        def get(self, size, device):
            return torch.full((size,), 0xAB, dtype=torch.uint8)

    calls = []
    real = native.copy_fp_batch
    monkeypatch.setattr(native, "copy_fp_batch", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    fast = flatten(_mixed_bucket(), 0, "cpu", Dirty(1))
    assert calls == [1]  # one call for the whole bucket
    slow = numpy_fp(lambda: flatten(_mixed_bucket(), 0, "cpu", Dirty(1)), monkeypatch)
    assert torch.equal(fast.data, slow.data) and fast.fingerprint == slow.fingerprint
    assert fast.fingerprint == fingerprint(fast.data)


@needs_kernel
def test_a_bucket_loaded_in_one_native_call_equals_the_numpy_load(monkeypatch):
    """The receiver's batched load: the same weights and fingerprint as the numpy path, with a target of
    another dtype (the general copy), an unknown name skipped (not strict), and padding fingerprinted."""
    from engine.sync.apply import load_flat

    bucket = _mixed_bucket()
    fb = flatten(bucket, 0, "cpu")

    def targets():
        t = {k: torch.empty(v.shape, dtype=v.dtype) for k, v in bucket.items() if k != "ints"}
        t["half"] = torch.empty(17, dtype=torch.float32)  # another dtype: copied and cast by torch
        return t

    calls = []
    real = native.copy_fp_batch
    monkeypatch.setattr(native, "copy_fp_batch", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    got = targets()
    copied = load_flat(got, fb, strict=False)
    assert calls == [1] and fb.fingerprint == fingerprint(fb.data)
    want = targets()
    fb2 = flatten(bucket, 0, "cpu")
    numpy_fp(lambda: load_flat(want, fb2, strict=False), monkeypatch)
    assert fb2.fingerprint == fb.fingerprint
    assert copied == sum(v.numel() * v.element_size() for k, v in bucket.items() if k != "ints")
    for k in got:
        assert torch.equal(got[k], want[k]) and torch.equal(got[k], bucket[k].to(got[k].dtype)), k


@needs_kernel
def test_a_bucket_index_pointing_outside_its_buffer_is_refused_before_any_copy():
    from engine.sync.apply import load_flat

    fb = flatten({"w": torch.ones(16)}, 3, "cpu")
    name, dtype, shape, offset, nbytes = fb.index[0]
    fb.index[0] = (name, dtype, (1 << 20,), offset, 4 << 20)  # a corrupt header: 4 MiB in a 64-byte buffer
    target = {"w": torch.zeros(1 << 20)}
    with pytest.raises(ValueError, match=r"weight bucket 3: entry 'w' .* not inside its 64-byte buffer"):
        load_flat(target, fb)
    assert not target["w"].any()


@needs_kernel
def test_a_sampled_batch_sums_every_stride_th_byte_of_each_copy_and_keeps_the_fingerprint():
    """`copy_fp_batch_sampled`: each region's sum of the bytes it copied at 0, stride, 2·stride, … (the weight
    sample's per-tensor sum), whatever the length against the kernel's sample chunk; the copy and the
    fingerprint are those of the unsampled batch."""
    rng = np.random.default_rng(5)
    chunk = 4 * SUPER
    lengths = [0, 1, 4099, 4100, 100_003, chunk - 1, chunk, chunk + 1, 2 * chunk + 4099 * 3, 3 * chunk + 12_345]
    size = sum(n + (-n) % 64 for n in lengths) + 64
    src = rng.integers(0, 256, size, dtype=np.uint8)
    regions, dsts, off = [], [], 0
    for n in lengths:
        dst = np.zeros(n + 64, np.uint8)
        dsts.append(dst)
        seen = n + (-n) % 8
        regions.append((dst.ctypes.data if n else 0, src.ctypes.data + off if n else 0, n, src.ctypes.data + off,
                        seen, off))
        off += n + (-n) % 64
    got = native.copy_fp_batch_sampled(regions, 4099)
    assert got is not None
    tot, strided, samples = got
    assert (tot, strided) == native.copy_fp_batch(regions)
    off = 0
    for n, dst, s in zip(lengths, dsts, samples):
        assert np.array_equal(dst[:n], src[off:off + n]) and not dst[n:].any()
        assert s == int(src[off:off + n][::4099].sum(dtype=np.int64)), n
        off += n + (-n) % 64
