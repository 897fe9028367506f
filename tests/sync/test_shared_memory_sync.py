"""The shared-memory weight sync (`engine.sync.shared_memory`): the trainer packs each bucket straight into a
ring of /dev/shm slots and receivers in other processes read it in place — bit-exactly, in the sender's dtype,
version after version, more buckets than slots (the ring is reused only once every receiver is done with a
slot), a bucket larger than the slots (a new ring), a receiver that stops early (the rest is acknowledged for
the sender), a replaced receiver in a new generation; and no file is left in /dev/shm."""

from __future__ import annotations

import multiprocessing as mp
import os
import threading

import pytest
import torch

from engine.sync.flat import fingerprint
from engine.sync.runtime import publish
from engine.sync.shared_memory import SharedMemorySync, sweep_stale

pytestmark = pytest.mark.timeout(120)


def version_buckets(version: int) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(version)
    out = [{"a.weight": torch.randn(70, 50, generator=g).to(torch.bfloat16), "a.bias": torch.randn(5, generator=g)},
           {"b.table": torch.randint(0, 9, (3, 4, 2), generator=g), "b.half": torch.randn(11, generator=g).half()},
           {"c.scalar": torch.tensor(float(version))}, {"d.w": torch.randn(33, generator=g)},
           {"e.w": torch.randn(9, 3, generator=g)}]
    if version == 3:  # larger than a slot: the ring is remade mid-version
        out.insert(2, {"big": torch.randn(300, 300, generator=g)})
    return out


def raw(t: torch.Tensor) -> tuple[str, tuple[int, ...], bytes]:
    return str(t.dtype), tuple(t.shape), t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()


def receiver(handles, rank: int, results, stop_early_at: int | None, quit_after: int | None) -> None:
    from engine.sync.shared_memory import pull

    for handle in iter(handles.get, None):
        got, sums = [], []
        for bucket in pull(handle, rank):
            sums.append(fingerprint(bucket.data))
            got.append({k: raw(v) for k, v in bucket.tensors()})
            if handle.version == stop_early_at:
                break  # a consumer that gives up mid-version: the rest is acknowledged for the sender
        results.put((rank, handle.version, got, sums))
        if handle.version == quit_after:
            break  # this process ends, as a killed replica does; a new one takes its rank
    results.close()
    results.join_thread()
    os._exit(0)


def publish_in_background(sync, buckets, receive) -> threading.Event:
    """Publish `buckets` as version 1 from a thread whose receivers' side is `receive(handle)` in another thread;
    the event is set once the publish returned and that side finished."""
    def send(refs):
        t = threading.Thread(target=receive, args=(refs[0],), daemon=True)
        t.start()
        return t

    done = threading.Event()
    threading.Thread(target=lambda: (publish(sync, 1, buckets, send).out.join(), done.set()), daemon=True).start()
    return done


def dying_receiver(handle, rank: int) -> None:
    """A replica killed mid-sync: it reads the first bucket, then its process ends without a word."""
    from engine.sync.shared_memory import pull

    received = pull(handle, rank)
    next(received)  # (held: a generator freed here would acknowledge the rest as it closes)
    os._exit(0)


def receiver_dying_before_it_maps(handle, rank: int) -> None:
    """A replica killed as its pull begins: it has registered itself, and its process ends as it would map the
    ring (so its pid never reaches the control page)."""
    import engine.sync.shared_memory as shm

    shm._map = lambda ring: os._exit(0)
    next(shm.pull(handle, rank))


def ring_files(run_id: str) -> list[str]:
    return [f for f in os.listdir("/dev/shm") if f.startswith(f"asyncrl-{run_id}-")]


@pytest.mark.slow
def test_slots_carry_every_byte_to_every_receiver_and_no_file_is_left_in_dev_shm() -> None:
    from engine.trainer.fsdp import free_port

    ctx = mp.get_context("spawn")
    world, run_id = 3, f"pytest{os.getpid()}"
    handles = [ctx.Queue() for _ in range(world - 1)]
    results = ctx.Queue()
    procs = [ctx.Process(target=receiver, args=(handles[0], 1, results, None, 2)),
             ctx.Process(target=receiver, args=(handles[1], 2, results, 2, None))]
    for p in procs:
        p.start()
    sync = SharedMemorySync("127.0.0.1", free_port(), world, run_id=run_id, slot_bytes=16 * 1024)
    gen = 0
    try:
        for version in (1, 2, 3, 4):
            if version == 3:  # rank 1's process ended after v2: a new one replaces it, in a new generation
                procs[0].join(timeout=30)
                procs.append(ctx.Process(target=receiver, args=(handles[0], 1, results, None, None)))
                procs[-1].start()
                gen += 1
            expected = version_buckets(version)

            def send(refs):
                for q in handles:
                    q.put(refs[0])

            sent = publish(sync, version, version_buckets(version), send, gen=gen)
            assert not ring_files(run_id)  # unlinked once every receiver mapped them: a crash leaks nothing
            assert sent.nbytes == sum(t.numel() * t.element_size() for b in expected for t in b.values())
            want = {name: raw(t) for b in expected for name, t in b.items()}
            for _ in range(world - 1):
                rank, got_version, got, sums = results.get(timeout=60)
                assert got_version == version
                assert sums == sent.fingerprints[:len(got)]  # the receiver's checksums are the sender's
                # the pieces regroup the buckets (`ramped`: small pieces at both ends, a short last bucket joined
                # to the one before); names place every tensor: dtype, shape and every byte
                received = {name: t for piece in got for name, t in piece.items()}
                if (rank, version) == (2, 2):  # stopped after the first piece
                    assert len(got) == 1 and received.items() <= want.items()
                else:
                    assert received == want
    finally:
        for q in handles:
            q.put(None)
        for p in procs:
            p.join(timeout=30)
        sync.close()
    assert [p.exitcode for p in procs] == [0] * len(procs)
    assert not ring_files(run_id)


def test_the_files_of_a_sender_that_died_are_swept() -> None:
    dead = os.path.join("/dev/shm", "asyncrl-pytest-sweep-p999999999-e0-s0")
    dead_ctrl = os.path.join("/dev/shm", "asyncrl-pytest-sweep-p999999999-e0-sc")  # its control page
    live = os.path.join("/dev/shm", f"asyncrl-pytest-sweep-p{os.getpid()}-e0-s0")
    for p in (dead, dead_ctrl, live):
        open(p, "wb").close()
    try:
        swept = sweep_stale()
        assert dead in swept and dead_ctrl in swept and os.path.exists(live)
        assert not os.path.exists(dead) and not os.path.exists(dead_ctrl)
    finally:
        for p in (dead, dead_ctrl, live):
            if os.path.exists(p):
                os.unlink(p)


def test_a_replica_loads_every_bucket_from_the_ring_fingerprinted_as_it_copies() -> None:
    """In one process (receiver on a thread): 5 buckets split into slot-sized pieces through 3 slots, one tensor
    larger than a slot; the model's
    tensors equal the sender's and the receiver's fused fingerprints equal the sender's."""
    import threading

    from engine.sync.apply import load_buckets_into
    from engine.sync.shared_memory import pull
    from engine.sync.verify import Delivery
    from engine.trainer.fsdp import free_port

    torch.manual_seed(0)
    src = torch.nn.Sequential(*[torch.nn.Linear(40, 40) for _ in range(4)], torch.nn.Linear(40, 300)).to(torch.bfloat16)
    dst = torch.nn.Sequential(*[torch.nn.Linear(40, 40) for _ in range(4)], torch.nn.Linear(40, 300)).to(torch.bfloat16)
    buckets = [{f"{i}.weight": m.weight.detach(), f"{i}.bias": m.bias.detach()} for i, m in enumerate(src)]
    run_id = f"pyt{os.getpid()}"
    sync = SharedMemorySync("127.0.0.1", free_port(), 2, run_id=run_id, slot_bytes=4096)
    got: dict = {}
    try:
        for version in (1, 2):
            def receive(handle) -> None:
                delivery = Delivery(pull(handle, 1))
                got["bytes"] = load_buckets_into(dst, delivery)
                got["fingerprints"] = delivery.fingerprints

            def send(refs):
                t = threading.Thread(target=receive, args=(refs[0],))
                t.start()
                return t

            sent = publish(sync, version, buckets, send)
            sent.out.join(timeout=60)
            assert got["fingerprints"] == sent.fingerprints
            # v1: split into slot-sized pieces; v2: the slots grew to the largest tensor at v1, and the short last
            # bucket ramps down together with the one before it (`ramped`): one piece per bucket at least
            assert len(sent.fingerprints) > 5 if version == 1 else len(sent.fingerprints) >= 5
            assert got["bytes"] == sent.nbytes
            assert all(torch.equal(a, b) for a, b in zip(src.state_dict().values(), dst.state_dict().values()))
            assert not ring_files(run_id)
            with torch.no_grad():
                for p in src.parameters():
                    p.add_(1)
    finally:
        sync.close()


def test_a_load_that_fails_releases_the_sender_at_once() -> None:
    """A replica whose load raises (here: a tensor its model lacks) acknowledges the rest of the version at once,
    while its error (and traceback) is still held: the sender's publish returns instead of waiting out its
    timeout (600 s here; the test's own timeout is 120 s)."""

    from engine.sync.apply import load_buckets_into
    from engine.sync.shared_memory import pull
    from engine.sync.verify import Delivery
    from engine.trainer.fsdp import free_port

    torch.manual_seed(0)
    src = torch.nn.Sequential(*[torch.nn.Linear(40, 40) for _ in range(4)])
    dst = torch.nn.Sequential(*[torch.nn.Linear(40, 40) for _ in range(3)])  # lacks layer 3
    buckets = [{f"{i}.weight": m.weight.detach(), f"{i}.bias": m.bias.detach()} for i, m in enumerate(src)]
    run_id = f"pytfail{os.getpid()}"
    sync = SharedMemorySync("127.0.0.1", free_port(), 2, run_id=run_id, slot_bytes=4096, timeout_s=600)
    got: dict = {}

    def receive(handle) -> None:
        try:
            load_buckets_into(dst, Delivery(pull(handle, 1)))
        except KeyError as e:
            got["error"] = e  # held, traceback and all, as an actor's error is while it is reported

    done = publish_in_background(sync, buckets, receive)
    try:
        assert done.wait(timeout=90), "the sender is still waiting for the failed replica's acknowledgements"
        assert "'3.weight' is not a tensor of the model" in str(got["error"])
        assert not ring_files(run_id)
    finally:
        sync.close()


def test_a_receiver_that_never_acknowledges_fails_the_sync_naming_it() -> None:
    """The per-piece acknowledgements are words of the ring's control page: a receiver that reads the first
    header but never loads while its side of the sync has not returned (a hung replica) leaves its word behind,
    and the sender's publish fails after `timeout_s` with a message naming the receiver rank and the piece — it
    does not hang, and it does not go on reusing a slot the receiver may still read."""
    import pickle
    import threading

    from engine.sync.shared_memory import _tag
    from engine.trainer.fsdp import free_port

    buckets = [{f"w{i}": torch.full((1000,), float(i))} for i in range(6)]  # 4 KB each: one slot each
    run_id = f"pytdead{os.getpid()}"
    sync = SharedMemorySync("127.0.0.1", free_port(), 2, run_id=run_id, slot_bytes=4096, timeout_s=2)
    seen: list = []
    release = threading.Event()

    def receive(handle) -> None:  # the "replica": reads the first header, then never acknowledges (nor returns)
        import datetime as dt

        store = torch.distributed.TCPStore(handle.host, handle.port, is_master=False,
                                           timeout=dt.timedelta(seconds=30))
        seen.append(pickle.loads(store.get(f"{_tag(handle)}/h0")))
        release.wait(30)

    def send(refs):
        t = threading.Thread(target=receive, args=(refs[0],), daemon=True)
        t.start()
        return t

    try:
        with pytest.raises(RuntimeError, match=r"receiver rank 1 did not acknowledge piece \d+ of ring .* within 2 s"):
            publish(sync, 1, buckets, send)
        assert seen and seen[0][5] == 1  # the header carried the piece's acknowledgement number
    finally:
        release.set()
        sync.close()
    assert not ring_files(run_id)


@pytest.mark.parametrize("dies", [dying_receiver, receiver_dying_before_it_maps], ids=["mid-sync", "before-it-maps"])
def test_a_receiver_that_dies_is_not_waited_for(dies) -> None:
    """A replica killed mid-sync stops acknowledging while the live ones still need the rest of the version. The
    sender sees that the receiver's process is gone — by the pid it wrote into the control page when it mapped
    the ring, or, killed before it mapped it (the first sync of a new group generation), by the pid it
    registered in the store as its pull began — and goes on without it, long before its `timeout_s` (600 s; the
    test waits 90 s), with every byte at the live receiver, the dead rank recorded as lost, and no file left in
    /dev/shm."""

    from engine.sync.shared_memory import pull
    from engine.trainer.fsdp import free_port

    buckets = [{f"w{i}": torch.full((1000,), float(i))} for i in range(6)]  # 4 KB each: one slot each
    run_id = f"pytkill{os.getpid()}{dies.__name__[:6]}"
    sync = SharedMemorySync("127.0.0.1", free_port(), 3, run_id=run_id, slot_bytes=4096, timeout_s=600)
    live: list = []

    def receive(handle) -> None:
        dying = mp.get_context("spawn").Process(target=dies, args=(handle, 2))
        dying.start()  # rank 2 ends without a word: after its first bucket, or as it would map the ring
        live.extend(next(bucket.tensors())[1].clone() for bucket in pull(handle, 1))  # rank 1 loads everything
        dying.join()

    done = publish_in_background(sync, buckets, receive)
    try:
        assert done.wait(timeout=90), "the sender is still waiting for the dead receiver"
        assert sync.ring.lost == {2}
        if dies is receiver_dying_before_it_maps:
            assert int(sync.ring.ctrl[256 + 2]) == 0  # it never wrote its pid into the control page
        assert sorted(t[0].item() for t in live) == [float(i) for i in range(6)]  # every bucket (in any order)
        assert not ring_files(run_id)
    finally:
        sync.close()


def test_a_new_sender_with_the_same_run_id_is_never_confused_with_the_old_one() -> None:
    """A sender made again in the same process with the same run id (a restarted trainer core) starts its epochs
    from 0 again: its files carry a fresh random token, so a receiver that mapped the old sender's files (cached
    by name) maps the new ones and loads the new weights, not the old files' stale bytes."""
    import threading

    from engine.sync.apply import load_buckets_into
    from engine.sync.shared_memory import pull
    from engine.sync.verify import Delivery
    from engine.trainer.fsdp import free_port

    torch.manual_seed(0)
    src = torch.nn.Sequential(*[torch.nn.Linear(40, 40) for _ in range(3)])
    dst = torch.nn.Sequential(*[torch.nn.Linear(40, 40) for _ in range(3)])
    run_id = f"pytsame{os.getpid()}"
    names = []
    for version in (1, 2):
        sync = SharedMemorySync("127.0.0.1", free_port(), 2, run_id=run_id, slot_bytes=4096)
        got: dict = {}

        def receive(handle) -> None:
            delivery = Delivery(pull(handle, 1))
            load_buckets_into(dst, delivery)
            got["fingerprints"] = delivery.fingerprints

        def send(refs):
            t = threading.Thread(target=receive, args=(refs[0],))
            t.start()
            return t

        try:
            buckets = [{f"{i}.weight": m.weight.detach(), f"{i}.bias": m.bias.detach()} for i, m in enumerate(src)]
            sent = publish(sync, version, buckets, send)
            sent.out.join(timeout=60)
            names.append(sync.ring.name)
        finally:
            sync.close()
        assert got["fingerprints"] == sent.fingerprints
        assert all(torch.equal(a, b) for a, b in zip(src.state_dict().values(), dst.state_dict().values()))
        with torch.no_grad():
            for p in src.parameters():
                p.mul_(-2)
    assert names[0] != names[1]
    assert not ring_files(run_id)
