"""The runtime's weight-sync transport, chosen by `rollout.weight_sync` (the trainer and replica sides).

* `"object_store"` (default): `ObjectStoreSync` — one `ray.put` per bucket, the replicas `ray.get` them.
* `"collective"`: `CollectiveSync` — trainer rank 0 broadcasts the buckets over a gloo (CPU) / NCCL (CUDA) group
  with the R rollout replicas (group ranks 1 … R by replica id; for vLLM, R × t ranks: each replica's t TP
  workers receive inside vLLM), streaming them as the trainer exports them.

`publish` is the trainer's one call per sync: it hands the replicas what they need (`send(refs)`, the
rollouter's `update_weights`) in the order each transport requires — object store: put every bucket, then
send the refs; collective: send the handle first (the replicas join the broadcast once generation is paused),
then broadcast. `resolve_buckets` is the replica's side: the buckets behind what it was sent.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from engine.sync.buckets import Bucket
from engine.sync.collective import CollectiveHandle, CollectiveSync, pull
from engine.sync.object_store import ObjectStoreSync

COLLECTIVE_DEVICES = ("cpu", "cuda")
"""Devices with a collective weight-sync transport (their backend: `engine.plan.devices.COLLECTIVE_BACKEND`)."""


def build_weight_sync(cfg: Any, device: str | None = None) -> ObjectStoreSync | CollectiveSync:
    """The transport of `cfg.rollout.weight_sync`, for trainer rank 0 (call it in that process); `device`: the
    plan's trainer device (default: the hardware preset's)."""
    if getattr(cfg.rollout, "weight_sync", "object_store") != "collective":
        return ObjectStoreSync()
    import ray

    from engine.plan.sizes import rollout_replicas
    from engine.plan.devices import COLLECTIVE_BACKEND
    from engine.runtime.backends import compute_device
    from engine.trainer.fsdp import free_port

    device = device or compute_device(cfg)
    if device not in COLLECTIVE_DEVICES:
        raise ValueError(f'rollout.weight_sync = "collective" has no transport on {device!r} (gloo on CPU, NCCL '
                         'on CUDA); use "object_store"')
    per_replica = cfg.rollout.tensor_parallel_size if cfg.rollout.backend == "vllm" else 1  # vLLM: its TP workers
    return CollectiveSync(ray.util.get_node_ip_address(), free_port(), 1 + rollout_replicas(cfg) * per_replica,
                          COLLECTIVE_BACKEND[device], per_replica=per_replica)


def publish(sync: Any, version: int, buckets: Iterable[Bucket], send: Callable[[list], Any]) -> tuple[Any, int]:
    """Move `buckets` (consumed as the trainer exports them) to the replicas; returns (`send`'s result, bytes)."""
    if isinstance(sync, CollectiveSync):
        handle = sync.announce(version)
        out = send([handle])
        sync.send(handle, buckets)
        return out, handle.nbytes
    handle = sync.push(version, buckets)
    return send(handle.refs), handle.nbytes


class CollectiveBuckets:
    """The buckets of a collective version, received lazily: iterating joins the group as `rank` in this process
    (the hf replica); a vLLM backend instead hands `handle` and `rank` to its workers, which receive themselves."""

    def __init__(self, handle: CollectiveHandle, rank: int) -> None:
        self.handle, self.rank = handle, rank

    def __iter__(self) -> Iterator[Bucket]:
        return pull(self.handle, self.rank)


def resolve_buckets(bucket_refs: list, replica_id: int) -> Iterable[Bucket]:
    """The buckets behind what a replica was sent: object refs (or buckets) in order, or a collective handle
    (`CollectiveBuckets`: received as group rank `handle.first_rank(replica_id)`, bucket by bucket)."""
    if len(bucket_refs) == 1 and isinstance(bucket_refs[0], CollectiveHandle):
        return CollectiveBuckets(bucket_refs[0], bucket_refs[0].first_rank(replica_id))
    import ray

    return [ray.get(r) if isinstance(r, ray.ObjectRef) else r for r in bucket_refs]
