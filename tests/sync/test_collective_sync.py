"""The collective weight sync (`engine.sync.collective`): trainer rank 0 broadcasts buckets over a stateless
gloo group to receivers in other processes, bucket by bucket, bit-exactly, version after version."""

from __future__ import annotations

import multiprocessing as mp

import numpy as np
import pytest

from engine.sync.collective import CollectiveSync

pytestmark = pytest.mark.timeout(120)


def version_buckets(version: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(version)
    return [{"a.weight": rng.standard_normal((7, 5)).astype(np.float32), "a.bias": rng.standard_normal(5)},
            {"b.table": rng.integers(0, 9, (3, 4, 2)), "b.half": rng.standard_normal(11).astype(np.float16)},
            {"c.scalar": np.asarray(version, dtype=np.float32)}]


def receiver(handles, rank: int, results, stop_early_at: int | None) -> None:
    from engine.sync.collective import pull

    for handle in iter(handles.get, None):
        got = []
        for bucket in pull(handle, rank):
            got.append({k: np.array(v) for k, v in bucket.items()})
            if handle.version == stop_early_at:
                break  # a consumer that gives up mid-version: the rest is drained for the sender
        results.put((rank, handle.version, got))


def test_broadcast_reaches_every_receiver_bit_exactly_and_survives_an_early_stop() -> None:
    from engine.trainer.fsdp import free_port

    ctx = mp.get_context("spawn")
    world = 3
    handles = [ctx.Queue() for _ in range(world - 1)]
    results = ctx.Queue()
    procs = [ctx.Process(target=receiver, args=(handles[r - 1], r, results, 2 if r == 2 else None))
             for r in range(1, world)]
    for p in procs:
        p.start()
    sync = CollectiveSync("127.0.0.1", free_port(), world)
    try:
        for version in (1, 2, 3):
            handle = sync.announce(version)
            for q in handles:
                q.put(handle)
            sync.send(handle, version_buckets(version))
            expected = version_buckets(version)
            assert handle.nbytes == sum(a.nbytes for b in expected for a in b.values())
            assert handle.num_buckets == 3
            for _ in range(world - 1):
                rank, got_version, got = results.get(timeout=60)
                assert got_version == version
                want = expected[:1] if (rank, version) == (2, 2) else expected
                assert len(got) == len(want)
                for g, w in zip(got, want):
                    assert list(g) == list(w)
                    for name in w:
                        assert g[name].dtype == w[name].dtype and g[name].shape == w[name].shape
                        assert np.array_equal(g[name], w[name]), name
    finally:
        for q in handles:
            q.put(None)
        for p in procs:
            p.join(timeout=30)
    assert all(p.exitcode == 0 for p in procs)
