"""The collective weight sync (`engine.sync.collective`): trainer rank 0 broadcasts flat buckets over a stateless
gloo group to receivers in other processes, bucket by bucket, bit-exactly and in the sender's dtype (bf16
stays bf16), version after version; a receiver process replaced between versions joins the next group
generation (as a restarted rollout replica does) and gets that version."""

from __future__ import annotations

import multiprocessing as mp

import pytest
import torch

from engine.sync.collective import CollectiveSync
from engine.sync.flat import fingerprint

pytestmark = pytest.mark.timeout(120)


def version_buckets(version: int) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(version)
    return [{"a.weight": torch.randn(7, 5, generator=g).to(torch.bfloat16), "a.bias": torch.randn(5, generator=g)},
            {"b.table": torch.randint(0, 9, (3, 4, 2), generator=g), "b.half": torch.randn(11, generator=g).half()},
            {"c.scalar": torch.tensor(float(version))}]


def raw(t: torch.Tensor) -> tuple[str, tuple[int, ...], bytes]:
    return str(t.dtype), tuple(t.shape), t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()


def receiver(handles, rank: int, results, stop_early_at: int | None, quit_after: int | None) -> None:
    from engine.sync.collective import pull

    for handle in iter(handles.get, None):
        got, sums = [], []
        for bucket in pull(handle, rank):
            sums.append(fingerprint(bucket.data))
            got.append({k: raw(v) for k, v in bucket.tensors()})  # plain bytes: this process may end early
            if handle.version == stop_early_at:
                break  # a consumer that gives up mid-version: the rest is drained for the sender
        results.put((rank, handle.version, got, sums))
        if handle.version == quit_after:
            return  # this process ends, as a killed replica does; a new one takes its rank


def test_broadcast_is_bit_exact_in_the_model_dtype_and_a_replaced_receiver_joins_the_next_generation() -> None:
    from engine.trainer.fsdp import free_port

    ctx = mp.get_context("spawn")
    world = 3
    handles = [ctx.Queue() for _ in range(world - 1)]
    results = ctx.Queue()
    procs = [ctx.Process(target=receiver, args=(handles[0], 1, results, None, 2)),
             ctx.Process(target=receiver, args=(handles[1], 2, results, 2, None))]
    for p in procs:
        p.start()
    sync = CollectiveSync("127.0.0.1", free_port(), world)
    gen = 0
    try:
        for version in (1, 2, 3, 4):
            if version == 3:  # rank 1's process ended after v2: a new process replaces it, in a new generation
                procs[0].join(timeout=30)
                procs.append(ctx.Process(target=receiver, args=(handles[0], 1, results, None, None)))
                procs[-1].start()
                gen += 1
            handle = sync.announce(version, gen)
            for q in handles:
                q.put(handle)
            sync.send(handle, version_buckets(version))
            expected = version_buckets(version)
            assert handle.nbytes == sum(t.numel() * t.element_size() for b in expected for t in b.values())
            assert handle.num_buckets == 3 and len(handle.fingerprints) == 3
            for _ in range(world - 1):
                rank, got_version, got, sums = results.get(timeout=60)
                assert got_version == version
                want = expected[:1] if (rank, version) == (2, 2) else expected
                assert sums == handle.fingerprints[:len(want)]  # the receiver's checksums are the sender's
                assert len(got) == len(want)
                for g, w in zip(got, want):
                    assert list(g) == list(w)
                    for name in w:  # dtype, shape and every byte
                        assert g[name] == raw(w[name]), name
    finally:
        for q in handles:
            q.put(None)
        for p in procs:
            p.join(timeout=30)
    assert [p.exitcode for p in procs] == [0] * len(procs)
