"""Weight sync by broadcast over a torch.distributed group: trainer rank 0 (group rank 0) → every rollout receiver
(group rank 1 + replica id × receivers per replica + worker: an hf replica is one receiver, a vLLM replica of
TP t has t, its workers, which join from inside vLLM: `engine.rollout.vllm_worker_ext`). Gloo on CPU, NCCL on
CUDA; no Ray in this module.

The group is *stateless*: its own `TCPStore` (hosted by the trainer, address carried in the handle) and a
`ProcessGroupGloo` / `ProcessGroupNCCL` object that is not the process's default group, so it lives beside the
trainer's own Megatron / FSDP2 world. It forms on the first sync: the trainer sends the handle to the replicas
(through the rollouter, as the object-store refs travel), both sides construct the group — which returns once
all `world` members are in — and the trainer then streams the buckets as it exports them.

Wire format, per bucket, three broadcasts from rank 0:

    header  int64 [2]    (len(meta), payload bytes); (0, 0) ends the version
    meta    uint8 [len]  pickle of [(name, numpy dtype, shape, nbytes), ...]
    payload uint8 [n]    the arrays' bytes back to back (C order)

The receiver rebuilds each array as a view of its payload (`np.frombuffer(...).view(dtype).reshape(shape)`),
so a bucket costs one copy per side (send packing, receive into the model). A receiver that stops consuming
early (a load error) drains the rest of the version, so the sender never waits on it.
"""

from __future__ import annotations

import datetime as _dt
import pickle
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from engine.sync.buckets import Bucket, bucket_nbytes

_END = (0, 0)


@dataclass
class CollectiveHandle:
    """One pushed version and where its group rendezvous (`host:port`, generation `gen`, `world` members)."""

    version: int
    host: str
    port: int
    world: int
    backend: str = "gloo"
    gen: int = 0
    nbytes: int = 0
    num_buckets: int = 0
    per_replica: int = 1  # receivers per replica: 1 (hf, or a vLLM replica's driver), t for a vLLM TP-t replica

    def first_rank(self, replica_id: int) -> int:
        """Group rank of replica `replica_id`'s first receiver (its worker w is this + w)."""
        return 1 + replica_id * self.per_replica

    @property
    def key(self) -> tuple[str, int, int]:
        return self.host, self.port, self.gen


class BroadcastGroup:
    """This process's member of one stateless group (rank 0 hosts the store)."""

    def __init__(self, host: str, port: int, rank: int, world: int, backend: str = "gloo",
                 timeout_s: float = 300.0, gen: int = 0) -> None:
        timeout = _dt.timedelta(seconds=timeout_s)
        self.rank, self.world, self.backend = rank, world, backend
        self.store = dist.TCPStore(host, port, world, is_master=rank == 0, timeout=timeout,
                                   wait_for_workers=False)
        store = dist.PrefixStore(f"asyncrl-weights-{gen}", self.store)
        if backend == "gloo":
            self.pg = dist.ProcessGroupGloo(store, rank, world, timeout)
            self.device = torch.device("cpu")
        elif backend == "nccl":
            self.pg = dist.ProcessGroupNCCL(store, rank, world)
            self.device = torch.device("cuda", torch.cuda.current_device())
        else:
            raise ValueError(f"collective weight sync over {backend!r} is not available (gloo on CPU, nccl on CUDA)")

    def _bcast(self, t: torch.Tensor) -> torch.Tensor:
        self.pg.broadcast(t, 0).wait()
        return t

    # --- rank 0 -----------------------------------------------------------------------------------------
    def send(self, buckets: Iterable[Bucket]) -> tuple[int, int]:
        """Broadcast every bucket, then the end marker. Returns (bytes, buckets)."""
        nbytes = count = 0
        for bucket in buckets:
            arrays = [np.asarray(a, order="C") for a in bucket.values()]  # (ascontiguousarray makes 0-d 1-d)
            meta = pickle.dumps([(n, a.dtype, a.shape, a.nbytes) for n, a in zip(bucket, arrays)])
            payload = np.concatenate([a.reshape(-1).view(np.uint8) for a in arrays]) if arrays else \
                np.zeros(0, np.uint8)
            self._bcast(torch.tensor([len(meta), payload.nbytes], dtype=torch.int64, device=self.device))
            self._bcast(torch.frombuffer(bytearray(meta), dtype=torch.uint8).to(self.device))
            self._bcast(torch.from_numpy(payload).to(self.device))
            nbytes += bucket_nbytes(bucket)
            count += 1
        self._bcast(torch.tensor(_END, dtype=torch.int64, device=self.device))
        return nbytes, count

    # --- ranks ≥ 1 --------------------------------------------------------------------------------------
    def receive(self) -> Iterator[Bucket]:
        """Yield the buckets of one version as rank 0 sends them; drains the version if closed early."""
        done = False
        try:
            while True:
                header = self._bcast(torch.zeros(2, dtype=torch.int64, device=self.device)).tolist()
                if tuple(header) == _END:
                    done = True
                    return
                meta = pickle.loads(self._bcast(torch.empty(header[0], dtype=torch.uint8,
                                                            device=self.device)).cpu().numpy().tobytes())
                payload = self._bcast(torch.empty(header[1], dtype=torch.uint8, device=self.device)).cpu().numpy()
                bucket, offset = {}, 0
                for name, dtype, shape, size in meta:
                    bucket[name] = np.reshape(payload[offset:offset + size].view(dtype), shape)
                    offset += size
                yield bucket
        finally:
            if not done:  # the consumer stopped early: take the rest so rank 0 is not left waiting
                while True:
                    header = self._bcast(torch.zeros(2, dtype=torch.int64, device=self.device)).tolist()
                    if tuple(header) == _END:
                        break
                    self._bcast(torch.empty(header[0], dtype=torch.uint8, device=self.device))
                    self._bcast(torch.empty(header[1], dtype=torch.uint8, device=self.device))


class CollectiveSync:
    """`WeightSync` by broadcast (module docstring). The producer side is `CollectiveSync(host, port, world)` on
    trainer rank 0; consumers call `pull(handle, rank)` (rank = 1 + replica id) in their own process.

    `push` is split in two so that the handle can reach the consumers before the (collective, blocking) send:
    `announce(version)` returns the handle; `send(handle, buckets)` joins the group on first use and
    broadcasts. `push` does both, for a caller whose consumers already pull concurrently."""

    def __init__(self, host: str, port: int, world: int, backend: str = "gloo", timeout_s: float = 300.0,
                 per_replica: int = 1) -> None:
        self.host, self.port, self.world, self.backend, self.timeout_s = host, port, world, backend, timeout_s
        self.per_replica = per_replica
        self.group: BroadcastGroup | None = None

    def announce(self, version: int) -> CollectiveHandle:
        return CollectiveHandle(version, self.host, self.port, self.world, self.backend, per_replica=self.per_replica)

    def send(self, handle: CollectiveHandle, buckets: Iterable[Bucket]) -> CollectiveHandle:
        if self.group is None:
            self.group = BroadcastGroup(self.host, self.port, 0, self.world, self.backend, self.timeout_s)
        handle.nbytes, handle.num_buckets = self.group.send(buckets)
        return handle

    def push(self, version: int, buckets: Iterable[Bucket]) -> CollectiveHandle:
        return self.send(self.announce(version), buckets)

    def release(self, handle: CollectiveHandle) -> None:
        """Nothing to free: the bytes live only in the receivers' models."""


_RECEIVERS: dict[tuple[tuple[str, int, int], int], BroadcastGroup] = {}
"""This process's consumer groups by (handle key, rank): one per trainer group generation and receiver (an
in-process vLLM worker and another receiver may share a process)."""


def pull(handle: CollectiveHandle, rank: int, timeout_s: float = 300.0) -> Iterator[Bucket]:
    """The buckets of `handle` received as group rank `rank` (≥ 1); joins the group on first use."""
    group = _RECEIVERS.get((handle.key, rank))
    if group is None:
        group = BroadcastGroup(handle.host, handle.port, rank, handle.world, handle.backend, timeout_s, handle.gen)
        _RECEIVERS[handle.key, rank] = group
    return group.receive()
