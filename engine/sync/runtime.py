"""The runtime's weight-sync pipeline, one for every transport (`rollout.weight_sync`):

    trainer export (model dtype) → pack into FlatBuckets + fingerprint ─┐ (thread, one bucket ahead)
                                                                       ├→ transport → receive (thread, one ahead)
                                                  load bucket k into the model ←┘ + fingerprint → receipt

* `"collective"` (default): `CollectiveSync` — trainer rank 0 broadcasts the flat buffers over a gloo (CPU) /
  NCCL (CUDA) / HCCL (NPU) group (backend from `engine.plan.devices.COLLECTIVE_BACKEND`) with the R rollout
  replicas (group ranks 1 … R by replica id; for vLLM, R × t ranks: each replica's t TP workers receive inside
  vLLM), streaming them as the trainer exports them. A replaced replica joins the next group generation.
* `"object_store"`: `ObjectStoreSync` — one `ray.put` per flat bucket, the replicas `ray.get` them zero-copy.

`publish` is the trainer's one call per sync: it hands the replicas what they need (`send(refs)`, the
rollouter's `update_weights`) in the order each transport requires — object store: put every bucket, then
send the refs; collective: send the handle first (the replicas join the broadcast once generation is paused),
then broadcast — and returns what was sent (bytes, per-bucket fingerprints and names) for the delivery check
(`engine.sync.verify`). `resolve_buckets` is the replica's side: a `Delivery` over the buckets it was sent.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from engine.sync.collective import CollectiveHandle, CollectiveSync, default_device, pull
from engine.sync.flat import BufferRing, FlatBucket, flatten
from engine.sync.object_store import ObjectStoreSync
from engine.sync.pipeline import ahead
from engine.sync.verify import Delivery

PIPELINE_DEPTH = 1
"""Buckets produced ahead of the one in flight, on each side (1 = double buffering)."""
RING_SLOTS = PIPELINE_DEPTH + 2
"""Resident buffers per side (`engine.sync.flat.BufferRing`): one consumed, `PIPELINE_DEPTH` queued, one filled."""
_RINGS: dict[str, BufferRing] = {}
"""This process's buffer rings by role ("send", "receive"), kept across syncs."""


def _ring(role: str) -> BufferRing:
    return _RINGS.setdefault(role, BufferRing(RING_SLOTS))


COLLECTIVE_DEVICES = ("cpu", "cuda")
"""Devices with a collective weight-sync transport (their backend: `engine.plan.devices.COLLECTIVE_BACKEND`)."""


def weight_transport(kind: str, device: str, backend: str = "gloo", host: str = "", port: int = 0,
                     receivers: int = 0, per_replica: int = 1) -> ObjectStoreSync | CollectiveSync:
    """The transport `kind` (`rollout.weight_sync`) for trainer rank 0 (call it in that process). `"collective"`:
    a group of 1 + `receivers` ranks (the trainer, then every receiving worker: `per_replica` per replica)
    meeting at `host:port` over `backend`, the collective backend of `device`. The caller picks them all
    (`engine.runtime.backends.build_weight_sync`: the plan's trainer device and its backend from
    `engine.plan.devices.COLLECTIVE_BACKEND`, this node's IP, a free port, the replica count), so this package
    imports neither the runtime, the trainer nor the plan."""
    if kind != "collective":
        return ObjectStoreSync()
    if device not in COLLECTIVE_DEVICES:
        raise ValueError(f'rollout.weight_sync = "collective" has no transport on {device!r} (gloo on CPU, NCCL '
                         'on CUDA); use "object_store"')
    return CollectiveSync(host, port, 1 + receivers, backend, per_replica=per_replica)


@dataclass
class Published:
    """What one sync sent: the `send` result, payload bytes, and per bucket its fingerprint and tensor names."""

    out: Any
    nbytes: int
    fingerprints: list[int]
    names: list[list[str]] = field(default_factory=list)


def packed(buckets: Iterable[Any], device: Any, names: list[list[str]],
           corrupt_bucket: int | None = None) -> Iterator[FlatBucket]:
    """The trainer's buckets as fingerprinted `FlatBucket`s on `device`, their names appended to `names`.
    `corrupt_bucket` (fault injection, `debug.corrupt_sync_bucket`): flip one byte of that bucket *after* its
    fingerprint was taken, as a fault on the wire would."""
    ring = _ring("send")  # the transports copy each bucket out before taking the next
    for seq, bucket in enumerate(buckets):
        fb = flatten(bucket, seq, device, ring)
        names.append(fb.names)
        if seq == corrupt_bucket and fb.nbytes:
            fb.data[0] ^= 0x5A
        yield fb


def publish(sync: Any, version: int, buckets: Iterable[Any], send: Callable[[list], Any], gen: int = 0,
            corrupt_bucket: int | None = None, members: list[int] | None = None) -> Published:
    """Move `buckets` (consumed as the trainer exports them, packed one bucket ahead of the transport) to the
    replicas; group generation `gen` (and for a catch-up only the replica slots `members`) for the collective
    (module docstring)."""
    names: list[list[str]] = []
    if isinstance(sync, CollectiveSync):
        handle = sync.announce(version, gen, members)
        out = send([handle])
        device = sync.device if sync.device is not None else default_device(sync.backend)
        sync.send(handle, ahead(packed(buckets, device, names, corrupt_bucket), PIPELINE_DEPTH))
        return Published(out, handle.nbytes, handle.fingerprints, names)
    handle = sync.push(version, ahead(packed(buckets, "cpu", names, corrupt_bucket), PIPELINE_DEPTH))
    return Published(send(handle.refs), handle.nbytes, handle.fingerprints, names)


def _fetch(refs: list) -> Iterator[Any]:
    import ray

    for r in refs:
        yield ray.get(r) if isinstance(r, ray.ObjectRef) else r


def resolve_buckets(bucket_refs: list, replica_id: int) -> Delivery:
    """The buckets behind what a replica was sent, fetched one bucket ahead of its load: object refs (or
    buckets) in order, or a collective handle (received as group rank `handle.first_rank(replica_id)`; a vLLM
    backend instead hands `handle` and `rank` to its workers, which receive themselves)."""
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
