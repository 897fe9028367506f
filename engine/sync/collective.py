"""Weight sync by broadcast over a torch.distributed group: trainer rank 0 (group rank 0) → every rollout receiver
(group rank 1 + replica id × receivers per replica + worker: an hf replica is one receiver, a vLLM replica of
TP t has t, its workers, which join from inside vLLM: `engine.rollout.vllm.worker_ext`). The backend and the
device are parameters (`backend`: gloo on CPU, nccl on CUDA, hccl on NPU — the caller picks it from
`engine.plan.devices.COLLECTIVE_BACKEND`); no Ray in this module.

The group is *stateless*: its own `TCPStore` (hosted by the trainer, address carried in the handle) and a
process-group object that is not the process's default group, so it lives beside the trainer's own Megatron /
FSDP2 world. **Generations**: the group of generation g uses the store prefix `asyncrl-weights-<g>`. When the
replica set changed (a replica died and was replaced) the trainer announces g + 1; every receiver — the
survivors and the replacement in the dead one's slot — joins the new group on its next pull, and the old
group is retired. A replacement gets the weights either at the next sync, over the same path, or — as soon
as it is up, when the trainer still holds the last synced version (no step since) — from a *catch-up group*:
the trainer and the waiting replacements alone (`members`, a negative generation of its own), after which
the next sync re-forms the full group in a new generation.

Wire format, per bucket, three broadcasts from rank 0 (the bucket is a `engine.sync.flat.FlatBucket`):

    header  int64 [3]    (seq, len(index), data bytes); (-1, 0, 0) ends the version
    index   uint8 [len]  pickle of the bucket's index [(name, dtype, shape, offset, nbytes), ...]
    data    uint8 [n]    the flat buffer, in the model's dtype, on the group's device

The receiver's tensors are views of its received buffer (one copy per side: the sender's pack, the
receiver's load into the model). Pipelining is the caller's (`engine.sync.pipeline.ahead` on both sides):
the sender packs bucket k+1 while k is broadcast, the receiver receives k+1 while it loads k. A receiver that
stops consuming early (a load error) drains the rest of the version, so the sender never waits on it.
"""

from __future__ import annotations

import datetime as _dt
import pickle
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from engine.sync.flat import BufferRing, FlatBucket, flatten
from engine.sync.store import host_store

_END = (-1, 0, 0)


@dataclass
class CollectiveHandle:
    """One pushed version and where its group rendezvous (`host:port`, generation `gen`, `world` members).
    After the send, `fingerprints` holds the sender's per-bucket checksums (`engine.sync.flat.fingerprint`)."""

    version: int
    host: str
    port: int
    world: int
    backend: str = "gloo"
    gen: int = 0
    nbytes: int = 0
    num_buckets: int = 0
    per_replica: int = 1  # receivers per replica: 1 (hf, or a vLLM replica's driver), t for a vLLM TP-t replica
    fingerprints: list[int] = field(default_factory=list)
    members: list[int] | None = None  # a catch-up group: only these replica slots, in this order (None: all)

    def first_rank(self, replica_id: int) -> int:
        """Group rank of replica `replica_id`'s first receiver (its worker w is this + w)."""
        slot = replica_id if self.members is None else self.members.index(replica_id)
        return 1 + slot * self.per_replica

    @property
    def key(self) -> tuple[str, int, int]:
        return self.host, self.port, self.gen


def default_device(backend: str) -> torch.device:
    """Where a `backend` group's buffers live: the host for gloo, this process's current accelerator else."""
    if backend == "gloo":
        return torch.device("cpu")
    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    if backend == "hccl":
        _torch_npu()
        return torch.device("npu", torch.npu.current_device())  # type: ignore[attr-defined]  # torch_npu
    raise ValueError(f"collective weight sync over {backend!r} is not available (gloo, nccl or hccl)")


BACKENDS = ("gloo", "nccl", "hccl")
"""The backends `_process_group` builds a stateless group for (`engine.plan.devices.COLLECTIVE_BACKEND`'s values)."""


def _torch_npu() -> object:
    """torch_npu, imported (it registers `torch.npu` and the HCCL backend); ValueError (one line) without it."""
    try:
        import torch_npu  # type: ignore[import-not-found]  # noqa: F401  (Ascend's PyTorch adapter)
    except ImportError as e:
        raise ValueError(f"collective weight sync over hccl needs torch_npu (Ascend's PyTorch adapter): {e}") from None
    return torch_npu


def _process_group(backend: str, store: object, rank: int, world: int, timeout: _dt.timedelta) -> object:
    """A stateless backend object of `world` ranks over `store` (not the process's default group). HCCL:
    `torch_npu._C._distributed_c10d.ProcessGroupHCCL(store, rank, size, options)` with `Options()._timeout`,
    torch_npu's own binding (the form vLLM-Ascend's stateless groups use); it is a `c10d.Backend`, like
    `ProcessGroupGloo` / `ProcessGroupNCCL`, so `broadcast(tensor, root)` is the same call on every backend."""
    if backend == "gloo":
        return dist.ProcessGroupGloo(store, rank, world, timeout)
    if backend == "nccl":
        return dist.ProcessGroupNCCL(store, rank, world)
    if backend == "hccl":  # Ascend: torch_npu registers the HCCL process group
        _torch_npu()
        from torch_npu._C._distributed_c10d import ProcessGroupHCCL  # type: ignore[import-not-found]

        options = ProcessGroupHCCL.Options()
        options._timeout = timeout
        return ProcessGroupHCCL(store, rank, world, options)
    raise ValueError(f"collective weight sync over {backend!r} is not available (gloo, nccl or hccl)")


class BroadcastGroup:
    """This process's member of one generation of the group, over `store` (rank 0 hosts it)."""

    def __init__(self, store: object, rank: int, world: int, backend: str = "gloo", timeout_s: float = 300.0,
                 gen: int = 0, device: torch.device | None = None) -> None:
        timeout = _dt.timedelta(seconds=timeout_s)
        self.rank, self.world, self.backend, self.gen = rank, world, backend, gen
        self.device = device if device is not None else default_device(backend)
        self.pg = _process_group(backend, dist.PrefixStore(f"asyncrl-weights-{gen}", store), rank, world, timeout)

    def _bcast(self, t: torch.Tensor) -> torch.Tensor:
        self.pg.broadcast(t, 0).wait()
        return t

    # --- rank 0 -----------------------------------------------------------------------------------------
    def send(self, buckets: Iterable[object]) -> tuple[int, list[int]]:
        """Broadcast every bucket (packed into a `FlatBucket` on this group's device if it is not one), then the
        end marker. Returns (payload bytes, the buckets' fingerprints)."""
        nbytes, sums = 0, []
        for seq, bucket in enumerate(buckets):
            fb = flatten(bucket, seq, self.device)
            data = fb.data if fb.data.device == self.device else fb.data.to(self.device)
            index = pickle.dumps(fb.index)
            self._bcast(torch.tensor([seq, len(index), data.numel()], dtype=torch.int64, device=self.device))
            self._bcast(torch.frombuffer(bytearray(index), dtype=torch.uint8).to(self.device))
            self._bcast(data)
            nbytes += fb.nbytes
            sums.append(int(fb.fingerprint))
        self._bcast(torch.tensor(_END, dtype=torch.int64, device=self.device))
        return nbytes, sums

    # --- ranks ≥ 1 --------------------------------------------------------------------------------------
    def _header(self) -> tuple[int, int, int]:
        h = self._bcast(torch.zeros(3, dtype=torch.int64, device=self.device)).tolist()
        return int(h[0]), int(h[1]), int(h[2])

    def receive(self, ring: BufferRing | None = None) -> Iterator[FlatBucket]:
        """Yield the buckets of one version as rank 0 sends them (each in a buffer of `ring`, else a fresh one, on
        this group's device); drains the version if closed early."""
        done = False
        try:
            while True:
                seq, n_index, n_data = self._header()
                if (seq, n_index, n_data) == _END:
                    done = True
                    return
                index = pickle.loads(self._bcast(torch.empty(n_index, dtype=torch.uint8, device=self.device))
                                     .cpu().numpy().tobytes())
                buf = ring.get(n_data, self.device) if ring is not None else \
                    torch.empty(n_data, dtype=torch.uint8, device=self.device)
                yield FlatBucket(index, self._bcast(buf), seq)
        finally:
            if not done:  # the consumer stopped early: take the rest so rank 0 is not left waiting
                while True:
                    seq, n_index, n_data = self._header()
                    if (seq, n_index, n_data) == _END:
                        break
                    self._bcast(torch.empty(n_index, dtype=torch.uint8, device=self.device))
                    self._bcast(torch.empty(n_data, dtype=torch.uint8, device=self.device))


class CollectiveSync:
    """`WeightSync` by broadcast (module docstring). The producer side is `CollectiveSync(host, port, world)` on
    trainer rank 0; consumers call `pull(handle, rank)` in their own process.

    `push` is split in two so that the handle can reach the consumers before the (collective, blocking) send:
    `announce(version, gen)` returns the handle; `send(handle, buckets)` joins that generation's group on first
    use and broadcasts. `push` does both, for a caller whose consumers already pull concurrently."""

    def __init__(self, host: str, port: int, world: int, backend: str = "gloo", timeout_s: float = 300.0,
                 per_replica: int = 1, device: torch.device | None = None) -> None:
        self.host, self.port, self.world, self.backend, self.timeout_s = host, port, world, backend, timeout_s
        self.per_replica, self.device = per_replica, device
        self.store: object | None = None
        self.group: BroadcastGroup | None = None

    def announce(self, version: int, gen: int = 0, members: list[int] | None = None) -> CollectiveHandle:
        """The handle of `version` for group generation `gen`: every replica slot, or a catch-up group of the
        slots `members` alone (a distinct `gen`, so it never meets a full group's store keys)."""
        world = self.world if members is None else 1 + len(members) * self.per_replica
        return CollectiveHandle(version, self.host, self.port, world, self.backend, gen=gen,
                                per_replica=self.per_replica, members=members)

    def send(self, handle: CollectiveHandle, buckets: Iterable[object]) -> CollectiveHandle:
        """Join generation `handle.gen` (a new one drops the old group) and broadcast `buckets`."""
        if self.store is None:
            self.store = host_store(self.host, self.port, self.world, self.timeout_s)  # on `host` only
        if self.group is None or self.group.gen != handle.gen:
            if self.group is not None:
                _RETIRED.append(self.group)
            self.group = BroadcastGroup(self.store, 0, handle.world, self.backend, self.timeout_s, handle.gen,
                                        self.device)
        handle.nbytes, handle.fingerprints = self.group.send(buckets)
        handle.num_buckets = len(handle.fingerprints)
        return handle

    def push(self, version: int, buckets: Iterable[object]) -> CollectiveHandle:
        return self.send(self.announce(version), buckets)

    def release(self, handle: CollectiveHandle) -> None:
        """Nothing to free: the bytes live only in the receivers' models."""


_STORES: dict[tuple[str, int], object] = {}
_RETIRED: list[BroadcastGroup] = []
"""Groups of older generations, kept, never destroyed: a gloo group whose peer died aborts the process when it
is destructed. One per replica restart (bounded by `rollout.max_replica_restarts`), a few sockets each."""
_RECEIVERS: dict[tuple[str, int, int], BroadcastGroup] = {}
"""This process's consumer groups by (host, port, rank): the newest generation it joined per receiver rank (an
in-process vLLM worker and another receiver may share a process)."""


def pull(handle: CollectiveHandle, rank: int, timeout_s: float = 300.0, device: torch.device | None = None,
         ring: BufferRing | None = None) -> Iterator[FlatBucket]:
    """The buckets of `handle` received as group rank `rank` (≥ 1); joins generation `handle.gen` on first use
    (retiring this rank's older generation). With `ring`, into its resident buffers (a bucket is overwritten
    `len(ring.slots)` buckets later: only for a consumer that copies each bucket out before the next)."""
    key = (handle.host, handle.port, rank)
    group = _RECEIVERS.get(key)
    if group is None or group.gen != handle.gen:
        store = _STORES.get(key[:2])
        if store is None:
            store = dist.TCPStore(handle.host, handle.port, handle.world, is_master=False,
                                  timeout=_dt.timedelta(seconds=timeout_s))
            _STORES[key[:2]] = store
        if key in _RECEIVERS:
            _RETIRED.append(_RECEIVERS.pop(key))
        group = BroadcastGroup(store, rank, handle.world, handle.backend, timeout_s, handle.gen, device)
        _RECEIVERS[key] = group
    return group.receive(ring)
