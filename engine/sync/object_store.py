"""Weight sync through Ray's object store (the CPU default).

`push` does one `ray.put` per bucket dict of numpy arrays: Ray stores numpy buffers out-of-band, so the
consumer's `ray.get` returns read-only arrays that *are* the shared-memory buffers (zero-copy; measured
~10 ms for 50 MB versus ~0.5 s for torch tensors). The consumer wraps them with `torch.from_numpy` and
copies them into its parameters (`engine.sync.apply.load_buckets_into`). Ray is imported only here.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from engine.sync.buckets import Bucket, bucket_nbytes


@dataclass
class ObjectStoreHandle:
    """A pushed version: the object refs of its buckets, in order. Picklable (refs travel by reference)."""

    version: int
    refs: list[Any] = field(default_factory=list)
    nbytes: int = 0
    push_seconds: float = 0.0

    @property
    def num_buckets(self) -> int:
        return len(self.refs)


class ObjectStoreSync:
    """`WeightSync` over the Ray object store: `push` on the trainer rank that owns the full weights,
    `pull` in each rollout replica (any worker of the same Ray cluster)."""

    def push(self, version: int, buckets: Iterable[Bucket]) -> ObjectStoreHandle:
        import ray

        start = time.perf_counter()
        handle = ObjectStoreHandle(version=version)
        for bucket in buckets:
            handle.refs.append(ray.put(bucket))
            handle.nbytes += bucket_nbytes(bucket)
        handle.push_seconds = time.perf_counter() - start
        return handle

    def pull(self, handle: ObjectStoreHandle) -> Iterator[Bucket]:
        import ray

        for ref in handle.refs:
            yield ray.get(ref)

    def release(self, handle: ObjectStoreHandle) -> None:
        """Drop this handle's refs; Ray frees the buffers once no holder (replica still pulling) is left."""
        handle.refs = []
