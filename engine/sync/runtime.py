"""The runtime's weight-sync pipeline, one for every transport (`rollout.weight_sync`):

    trainer export (model dtype) → pack into FlatBuckets + fingerprint ─┐ (thread, one bucket ahead)
                                                                       ├→ transport → receive (thread, one ahead)
                                                  load bucket k into the model ←┘ + fingerprint → receipt

* `"shared_memory"` (what `"auto"`, the default, is on one CPU host): `SharedMemorySync` — the trainer packs
  each bucket into a ring of /dev/shm buffers, every replica copies it from there into its parameters
  (`engine.sync.shared_memory`); a `CollectiveSync` in its generations, members and catch-up.
* `"collective"` (what `"auto"` is elsewhere): `CollectiveSync` — trainer rank 0 broadcasts the flat buffers over a gloo (CPU) /
  NCCL (CUDA) / HCCL (NPU) group (backend from `engine.plan.devices.COLLECTIVE_BACKEND`) with the R rollout
  replicas (group ranks 1 … R by replica id; for vLLM, R × t ranks: each replica's t TP workers receive inside
  vLLM), streaming them as the trainer exports them. A replaced replica joins the next group generation.
* `"object_store"`: `ObjectStoreSync` — one `ray.put` per flat bucket, the replicas `ray.get` them zero-copy.

With `rollout.quantization = "fp8"` every transport moves the same thing: each exported bucket quantised on the
sender (`engine.sync.fp8`: fp8 weight + fp32 `weight_scale_inv` per 128 × 128 block for the decoder layers' linear
weights) before it is packed, so the fingerprints and byte counts are over the fp8 bytes actually sent.

`publish` is the trainer's one call per sync: it hands the replicas what they need (`send(refs)`, the
rollouter's `update_weights`) in the order each transport requires — object store: put every bucket, then
send the refs; collective and shared memory: send the handle first (the replicas join the broadcast once generation is paused),
then broadcast — and returns what was sent (bytes, per-bucket fingerprints and names) for the delivery check
(`engine.sync.verify`). `resolve_buckets` is the replica's side: a `Delivery` over the buckets it was sent —
loaded in place during the pause, or (`hf` replicas with a back buffer, `engine.sync.staging`) staged into a
second copy of the weights while the replica still generates and swapped in at the pause.
"""

from __future__ import annotations

import sys

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from engine.sync.buckets import bucketize
from engine.sync.collective import CollectiveHandle, CollectiveSync, default_device, pull
from engine.sync.flat import BufferRing, FlatBucket, flatten
from engine.sync.fp8 import quantized
from engine.sync.object_store import ObjectStoreSync
from engine.sync.pipeline import ahead
from engine.sync.shared_memory import SharedMemoryHandle, SharedMemorySync
from engine.sync.shared_memory import pull as shm_pull
from engine.sync.verify import Delivery

PIPELINE_DEPTH = 1
"""Buckets produced ahead of the one in flight, on each side (1 = double buffering)."""
RING_SLOTS = PIPELINE_DEPTH + 2
"""Resident buffers per side (`engine.sync.flat.BufferRing`): one consumed, `PIPELINE_DEPTH` queued, one filled."""
_RINGS: dict[str, BufferRing] = {}
"""This process's buffer rings by role ("send", "receive"), kept across syncs."""


def _ring(role: str) -> BufferRing:
    return _RINGS.setdefault(role, BufferRing(RING_SLOTS))


SHM_SLOT_BYTES = 64 * 2**20
"""Slot size of the shared-memory ring (at most `weight_sync_bucket_mb`): each exported bucket is split into
pieces of at most this many bytes, so the receivers start loading after 64 MiB, not after a whole 512 MiB
bucket (with 3 buckets for a 500M bf16 model, the first and last would not overlap at all)."""


def split_buckets(buckets: Iterable[Any], nbytes: int) -> Iterator[Any]:
    """Each bucket (name → tensor, or a `FlatBucket` as is) in pieces of at most `nbytes` (a tensor larger
    than that travels alone), in order."""
    for bucket in buckets:
        if isinstance(bucket, FlatBucket) or not hasattr(bucket, "items"):
            yield bucket
            continue
        yield from bucketize(bucket.items(), nbytes)


RAMP_BYTES = 4 * 2**20
"""The shared-memory pieces of a version ramp up from this size at its start and down to it at its end
(`ramped`)."""


def _size(t: Any) -> int:
    return int(t.nbytes)


def _ramp_up(items: list[tuple[str, Any]], nbytes: int, ramp: int) -> list[dict[str, Any]]:
    """`items` in pieces of at most ramp, 2·ramp, 4·ramp, … `nbytes` bytes, in order (a tensor larger than its
    piece's limit travels alone)."""
    pieces: list[dict[str, Any]] = []
    current: dict[str, Any] = {}
    size, limit = 0, max(1, min(ramp, nbytes))
    for name, t in items:
        n = _size(t)
        if current and size + n > limit:
            pieces.append(current)
            current, size, limit = {}, 0, min(2 * limit, nbytes)
        current[name] = t
        size += n
    if current:
        pieces.append(current)
    return pieces


def _plain(bucket: Any) -> bool:
    return bucket is not None and not isinstance(bucket, FlatBucket) and hasattr(bucket, "items")


def ramped(buckets: Iterable[Any], nbytes: int, ramp: int = RAMP_BYTES) -> Iterator[Any]:
    """`split_buckets` for the shared-memory ring, with small pieces at both ends of the version. The replicas
    cannot start before the first piece is packed, and the trainer has nothing left to pack while they load the
    last one, so those two are not overlapped: the first exported bucket goes smallest tensors first, in pieces
    growing from `ramp` bytes to `nbytes`; the last one largest first, in pieces shrinking to `ramp` (a single
    bucket: half its tensors each way); the buckets between are split as `split_buckets` does. A last bucket
    under 2·`nbytes` (a 500M model's: its 98 MB tied lm_head alone, loaded while the trainer had nothing left
    to pack) is ramped down together with the bucket before it (held one bucket longer: the trainer's export
    is views of its tensors), so that one goes out first and the version still ends in small pieces. Every
    tensor travels once, in a piece of at most `nbytes` bytes or alone; names, not order, place it on the
    receiver."""
    it = iter(buckets)
    current = next(it, None)
    following = next(it, None) if current is not None else None
    first = True
    while current is not None:
        after = next(it, None) if following is not None else None
        if after is None and not first and _plain(current) and _plain(following) \
                and sum(_size(t) for t in following.values()) < 2 * nbytes:  # a short last bucket: one tail
            current, following = {**current, **following}, None
        if not _plain(current):
            yield current
        elif first or following is None:
            items = sorted(current.items(), key=lambda kv: _size(kv[1]))
            if first and following is None:  # one bucket: up through one half, down through the other
                head, tail = items[0::2], items[1::2]
            else:
                head, tail = (items, []) if first else ([], items)
            yield from _ramp_up(head, nbytes, ramp)
            yield from reversed(_ramp_up(tail, nbytes, ramp))
        else:
            yield from bucketize(current.items(), nbytes)
        first, current, following = False, following, after


COLLECTIVE_DEVICES = ("cpu", "cuda", "npu")
"""Devices with a collective weight-sync transport (their backend: `engine.plan.devices.COLLECTIVE_BACKEND`)."""


def weight_transport(kind: str, device: str, backend: str = "gloo", host: str = "", port: int = 0,
                     receivers: int = 0, per_replica: int = 1, run_id: str = "run",
                     slot_bytes: int = SHM_SLOT_BYTES) -> ObjectStoreSync | CollectiveSync | SharedMemorySync:
    """The transport `kind` (`rollout.weight_sync`, "auto" already resolved: `engine.plan.devices.
    weight_sync_transport`) for trainer rank 0 (call it in that process). `"collective"` / `"shared_memory"`: a
    group of 1 + `receivers` ranks (the trainer, then every receiving worker: `per_replica` per replica)
    meeting at `host:port` (the shared-memory control messages use the same store), over `backend`, the
    collective backend of `device`; `run_id` names the shared-memory files, `slot_bytes` sizes their slots.
    The caller picks them all (`engine.runtime.backends.build_weight_sync`), so this package imports neither
    the runtime, the trainer nor the plan."""
    if kind == "shared_memory":
        if device != "cpu":
            raise ValueError(f'rollout.weight_sync = "shared_memory" needs device cpu, not {device!r}')
        return SharedMemorySync(host, port, 1 + receivers, run_id=run_id, slot_bytes=slot_bytes,
                                per_replica=per_replica)
    if kind != "collective":
        return ObjectStoreSync()
    if device not in COLLECTIVE_DEVICES:
        raise ValueError(f'rollout.weight_sync = "collective" has no transport on {device!r} (gloo on CPU, NCCL '
                         'on CUDA, HCCL on NPU); use "object_store"')
    return CollectiveSync(host, port, 1 + receivers, backend, per_replica=per_replica)


@dataclass
class Published:
    """What one sync sent: the `send` result, payload bytes, and per bucket its fingerprint and tensor names."""

    out: Any
    nbytes: int
    fingerprints: list[int]
    names: list[list[str]] = field(default_factory=list)


def packed(buckets: Iterable[Any], device: Any, names: list[list[str]],
           corrupt_bucket: int | None = None, ring: Any = None) -> Iterator[FlatBucket]:
    """The trainer's buckets as fingerprinted `FlatBucket`s on `device`, packed into `ring`'s buffers (default:
    this process's send ring), their names appended to `names`. `corrupt_bucket` (fault injection,
    `debug.corrupt_sync_bucket`): flip one byte of that bucket *after* its fingerprint was taken, as a fault on
    the wire would."""
    ring = ring if ring is not None else _ring("send")  # the transports copy each bucket out before the next
    mark = getattr(ring, "mark", None)  # a shared-memory ring keeps the sync's timeline
    for seq, bucket in enumerate(buckets):
        fb = flatten(bucket, seq, device, ring)
        if mark is not None:
            mark("packed", seq)
        names.append(fb.names)
        if seq == corrupt_bucket and fb.nbytes:
            fb.data[0] ^= 0x5A
        yield fb


def publish(sync: Any, version: int, buckets: Iterable[Any], send: Callable[[list], Any], gen: int = 0,
            corrupt_bucket: int | None = None, members: list[int] | None = None,
            quantization: str | None = None) -> Published:
    """Move `buckets` (consumed as the trainer exports them, packed one bucket ahead of the transport) to the
    replicas; group generation `gen` (and for a catch-up only the replica slots `members`) for the collective
    (module docstring). `quantization` = "fp8" (`rollout.quantization`): each bucket is quantised on the way
    (`engine.sync.fp8.quantize_bucket`, on the packing thread), so what is packed, fingerprinted, sent and counted
    is the fp8 weights and their block scales."""
    names: list[list[str]] = []
    if quantization == "fp8":
        buckets = quantized(buckets)
    elif quantization is not None:
        raise ValueError(f"rollout.quantization = {quantization!r}: the weight sync sends fp8 or the model's dtype")
    if isinstance(sync, CollectiveSync):
        handle = sync.announce(version, gen, members)
        out = send([handle])
        device = sync.device if sync.device is not None else default_device(sync.backend)
        ring = None
        if isinstance(sync, SharedMemorySync):  # packed straight into /dev/shm, in slot-sized pieces
            ring = sync.ring_for(handle)
            buckets = ramped(buckets, ring.slot_bytes)
        pieces = ahead(packed(buckets, device, names, corrupt_bucket, ring), PIPELINE_DEPTH)
        if ring is not None:
            sync.send(handle, pieces, receivers_done=returned(out))
        else:
            sync.send(handle, pieces)
        return Published(out, handle.nbytes, handle.fingerprints, names)
    handle = sync.push(version, ahead(packed(buckets, "cpu", names, corrupt_bucket), PIPELINE_DEPTH))
    return Published(send(handle.refs), handle.nbytes, handle.fingerprints, names)


def returned(out: Any) -> Callable[[], bool]:
    """Whether the receivers' side of a sync (`send`'s result: a peer's `Pending` (`engine.runtime.peers`), a Ray
    object ref, or a thread in tests) has returned — every receiver that will acknowledge has, so the sender stops
    waiting for the others."""
    done = getattr(out, "done", None)
    if callable(done):
        return lambda: bool(done())
    ray = sys.modules.get("ray")
    if ray is not None and isinstance(out, ray.ObjectRef):
        return lambda: bool(ray.wait([out], timeout=0)[0])
    is_alive = getattr(out, "is_alive", None)
    return (lambda: not is_alive()) if callable(is_alive) else (lambda: False)


def _fetch(refs: list) -> Iterator[Any]:
    """Each ref's object (`ray.get`), or the bucket itself (an in-process store holds no refs: no Ray imported)."""
    for r in refs:
        ray = sys.modules.get("ray")
        yield ray.get(r) if ray is not None and isinstance(r, ray.ObjectRef) else r


def resolve_buckets(bucket_refs: list, replica_id: int) -> Delivery:
    """The buckets behind what a replica was sent, fetched one bucket ahead of its load: object refs (or
    buckets) in order, or a collective handle (received as group rank `handle.first_rank(replica_id)`; a vLLM
    backend instead hands `handle` and `rank` to its workers, which receive themselves)."""
    if len(bucket_refs) == 1 and isinstance(bucket_refs[0], SharedMemoryHandle):
        handle = bucket_refs[0]  # the slots are read in place: no receive to overlap, the sender packs ahead
        return Delivery(_Lazy(lambda: shm_pull(handle, handle.first_rank(replica_id))))
    if len(bucket_refs) == 1 and isinstance(bucket_refs[0], CollectiveHandle):
        handle = bucket_refs[0]
        rank = handle.first_rank(replica_id)
        # every consumer in a replica's process copies a bucket out before the next (hf: into its parameters;
        # vLLM's driver: into the RPC's bytes), so the receive buffers can be a resident ring
        return Delivery(_Lazy(lambda: ahead(pull(handle, rank, ring=_ring("receive")), PIPELINE_DEPTH)),
                        handle, rank)
    return Delivery(_Lazy(lambda: ahead(_fetch(bucket_refs), PIPELINE_DEPTH)))


class _Lazy:
    """An iterable that builds its iterator on first use (so nothing is received unless the backend asks)."""

    def __init__(self, make: Callable[[], Iterator[Any]]) -> None:
        self.make = make

    def __iter__(self) -> Iterator[Any]:
        return self.make()
