"""The `WeightSync` seam: how a new policy version travels from the trainer to the rollout replicas.

The trainer side calls `push(version, buckets)` once per sync and hands the returned handle (a small,
picklable object) to every replica; each replica calls `pull(handle)` and feeds the buckets to its
`RolloutBackend.update_weights`. The CPU default moves buckets through Ray's object store
(`engine.sync.object_store`); an NCCL broadcast implementation plugs in behind the same two calls.

Timing is split by the caller (the rollouter), which knows when generation was paused:
`pause_s` = generation stopped → weights loaded and generation resumed (the whole sync as the replicas
see it, reported as `timing_s/param_sync`), `transfer_s` = the part spent inside push + pull + load. With
back buffers (`engine.sync.staging`) the pull + load happen before the pause (`stage_s`) and `transfer_s`
is the swap.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from engine.sync.buckets import Bucket


@dataclass
class SyncRecord:
    """What one weight sync cost, as recorded in `events.jsonl` / `timing_s/param_sync*` metrics."""

    version: int
    bytes: int
    num_buckets: int
    transfer_s: float
    pause_s: float

    def as_metrics(self) -> dict[str, float]:
        return {
            "timing_s/param_sync": self.pause_s,
            "timing_s/param_sync_transfer": self.transfer_s,
            "timing_s/param_sync_pause": self.pause_s,
            "asyncrl/param_sync_bytes": float(self.bytes),
        }


@runtime_checkable
class WeightSync(Protocol):
    """Moves versioned weight buckets from one producer to any number of consumers."""

    def push(self, version: int, buckets: Iterable[Bucket]) -> Any:
        """Publish `buckets` (HF name → tensor, packed into `FlatBucket`s) as `version`; returns a picklable handle
        with at least `version`, `nbytes`, `num_buckets` and `fingerprints` (one per bucket) attributes."""
        ...

    def pull(self, handle: Any) -> Iterator[Any]:
        """Yield the `FlatBucket`s of `handle`, in push order (callable from any process that has the handle)."""
        ...

    def release(self, handle: Any) -> None:
        """Drop the producer's references so the transport can free the buffers."""
        ...
