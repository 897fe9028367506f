"""Same-host weight sync through shared memory (`rollout.weight_sync = "shared_memory"`; what `"auto"` resolves to
on CPU: `engine.plan.devices.weight_sync_transport`).

The bytes never cross a socket. The sender packs bucket k straight into slot k mod S of a ring of S buffers in
`/dev/shm` (its one copy, fused with its fingerprint: `engine.sync.flat.flatten`); each receiver maps the same
files and copies the bucket from the slot into its parameters (its one copy, fused with its fingerprint:
`engine.sync.apply.load_flat`). Only small control messages travel: headers and the end over the trainer's `TCPStore` (its address in the
handle, as for the collective), the per-piece acknowledgements as words in a shared-memory control page:

    sender    "<tag>/h<k>"         pickle((seq, slot, data bytes, index, ring, ack))  — None after the last bucket
    receiver  control word <rank>  = ack: done with that piece (loaded and fingerprinted), its slot may be reused
    receiver  "<tag>/a<n>/<rank>"  read the end marker (piece n = the count): the version's keys may be deleted
    receiver  "<tag>/p<rank>"      its process id, as its pull begins (before it has mapped the ring)
    tag = "shm/<version>/<gen>", ring = (epoch name, slot paths, slot bytes, control page path),
    ack = the piece's number in the ring's epoch (1, 2, … across syncs: a word only grows)

The acknowledgement is a store to the receiver's own word of the page (`ring …-sc`), which the sender's pack
thread polls (sleeping 20 µs → 0.5 ms between reads) only when it must reuse a slot: no round trip answered by a
third thread. With the store, each acknowledgement was a `set` the trainer's store thread had to be scheduled
to answer, on 2 cores busy with the pack and the load: ~0.1 ms each when nothing else ran, 5–28 ms each (up to
~190 ms a sync) when another process was runnable (issue 24, eighth pass).

Pipelining: the sender packs bucket k+1 into the next slot while the receivers load bucket k (two processes,
no thread needed for the overlap); it blocks only before reusing a slot whose bucket some receiver has not
acknowledged, so with S = 3 it runs up to two buckets ahead. Time per sync ≈ one copy of the model on the
slower side, plus one bucket. The handle is a `CollectiveHandle` (generation, member slots, receiver ranks), so
group generations, the catch-up of a replaced replica and the delivery check work as for the collective.

The ring's files: `/dev/shm/asyncrl-<run id>-<token>-p<pid>-e<epoch>-s<slot>` and `…-sc` (the control page; `token`: random per sender, so
a sender made again in the same process never reuses an earlier one's names), made (and `posix_fallocate`d, so a full
`/dev/shm` is an error, not a SIGBUS) at the first sync, when a bucket outgrows the slots, and for every new
group generation (a replacement must map them). Each receiver maps all slots of an epoch when it first sees it;
at the end of the epoch's first sync (every receiver acknowledged every bucket, so all have mapped them) the
sender *unlinks* the files: the memory then lives exactly as long as the processes that map it, so a stop, a
crash, a kill or Ctrl-C leaves nothing in `/dev/shm`. During that first sync, `close()` (the trainer's stop),
an exit handler, and the sweep of files whose sender process is gone (`sweep_stale`, at the next ring creation
on this host) remove them.

Limits: every receiver on the sender's host (a receiver that cannot find a slot file says so); host memory on
both sides (CPU trainer and `hf` replicas); no Ray here; at most `PID_WORDS` − 1 = 255 receivers. A receiver
that dies mid-sync (a killed replica) stops acknowledging: each receiver registers its process id in the store
as its pull begins and writes it into the control page when it maps the ring, and the sender, while it waits,
checks every `CHECK_S` whether that process still runs — a rank whose process is gone (or any rank still missing
once the receivers' side of the sync has returned: `send(…, receivers_done)`, the rollouter's `update_weights`)
is not waited for (`ShmRing.lost`); the rollouter reports the dead replica and the run replaces it. A receiver
that runs but never acknowledges (hung), or dies before its pull began, fails the sync after `timeout_s`, naming
the receiver and the piece. The pid check assumes the sender and its receivers share a PID namespace (one host,
one Ray node); a receiver in another one would read as gone and be dropped, and the delivery check would then
fail the sync naming it — loud, not silent. One whose load
raises acknowledges the rest at once (`engine.sync.apply.load_into` closes the pull), so the sender finishes and
the replica's error is reported.
"""

from __future__ import annotations

import datetime as _dt
import os
import pickle
import re
import secrets
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from engine.sync.collective import CollectiveHandle, CollectiveSync
from engine.sync.flat import ALIGN, FlatBucket
from engine.sync.store import host_store
from engine.sync.shm_files import (  # noqa: F401 - sweep_stale and SHM_DIR are this module's API too
    CONTROL_WORDS,
    PID_WORDS,
    SHM_DIR,
    _aligned,
    _alive,
    _create,
    _map,
    _unlink,
    sweep_stale,
)

SLOTS = 3
"""Shared-memory buffers in the ring: one being loaded, one packed ahead, one spare for uneven stages."""
CHECK_S = 0.2
"""While waiting for an acknowledgement, how often the sender asks whether the receiver's process still runs and
whether the receivers' side of the sync has returned (`ShmRing._gone`)."""


@dataclass
class SharedMemoryHandle(CollectiveHandle):
    """A version sent through the shared-memory ring; the store address, generation and member slots are the
    collective's (`CollectiveHandle`)."""


def _tag(handle: CollectiveHandle) -> str:
    return f"shm/{handle.version}/{handle.gen}"


class ShmRing:
    """The sender's ring of `SLOTS` shared-memory buffers (module docstring). `get(size, device)` is the
    `engine.sync.flat.BufferRing` interface the pack writes through: it returns the next slot once every
    receiver has acknowledged the bucket that slot held."""

    def __init__(self, run_id: str, slots: int, slot_bytes: int, directory: str = SHM_DIR,
                 timeout_s: float = 300.0) -> None:
        self.run_id, self.nslots, self.slot_bytes, self.directory = run_id, slots, slot_bytes, directory
        self.timeout_s = timeout_s
        self.epoch = -1
        self.paths: list[str] = []
        self.buffers: list[torch.Tensor] = []
        self.linked = False
        self.next = 0
        self.order: deque[int] = deque()  # slots handed to the pack, not yet published by `send`
        self.pending: dict[int, tuple[int, list[int]]] = {}  # slot → (its piece's ack number, the ranks to ack it)
        self.ctrl_path = ""
        self.ctrl: np.ndarray | None = None  # the control page's words (int64), mapped read-write
        self.acked = 0  # ack numbers handed out in this epoch
        self.cond = threading.Condition()
        self.acks: Any = None  # a store client of its own: `get` waits in the pack's thread
        self._finalizer: weakref.finalize | None = None
        self.marks: list[tuple[str, int, float]] = []  # this sync's timeline (`begin`, `mark`)
        self.handed = 0  # pieces handed to the pack in this sync
        self.receivers_done: Callable[[], bool] = lambda: False
        self.lost: set[int] = set()  # ranks this sync stopped waiting for (`_gone`)
        self.tag = ""  # this sync's store prefix (`begin`)
        self.acks_lock = threading.Lock()

    def begin(self, receivers_done: Callable[[], bool] | None = None, tag: str = "") -> None:
        """A new sync (`tag`: its store keys' prefix): its timeline starts empty (`marks`), no rank is lost;
        `receivers_done()` turns true once the receivers' side has returned (every receiver that will
        acknowledge has): a rank still missing then is lost (`_gone`)."""
        self.marks, self.handed, self.lost, self.tag = [], 0, set(), tag
        self.receivers_done = receivers_done or (lambda: False)

    def _gone(self, r: int, since: float) -> bool:
        """Whether to stop waiting for rank `r` (asked at most every `CHECK_S` of waiting): its process is gone
        (the pid it wrote into the control page no longer runs: a replica killed mid-sync, which the rollouter
        reports and replaces), or the receivers' side of the sync returned without it. A receiver that has not
        mapped this ring yet is known by the pid it registered in the store when its pull began (`pull`)."""
        if r in self.lost:
            return True
        if time.monotonic() - since < CHECK_S:
            return False
        pid = int(self.ctrl[PID_WORDS + r]) if self.ctrl is not None else 0
        if pid == 0 and self.tag and self.acks is not None:
            with self.acks_lock:  # (the pack's and the send's threads may both wait)
                key = f"{self.tag}/p{r}"
                pid = int(self.acks.get(key)) if self.acks.check([key]) else 0
        if (pid > 0 and not _alive(pid)) or self.receivers_done():
            self.lost.add(r)
            return True
        return False

    def mark(self, event: str, k: int = -1) -> None:
        """Record `event` of piece `k` at `time.monotonic()` (system-wide: comparable with the receivers')."""
        self.marks.append((event, k, time.monotonic()))

    @property
    def name(self) -> str:
        return f"asyncrl-{self.run_id}-p{os.getpid()}-e{self.epoch}"

    def renew(self, slot_bytes: int) -> None:
        """A new epoch: fresh files of `slot_bytes` (the old ones are unlinked; their memory goes when the last
        receiver drops its mapping)."""
        self.drop()
        sweep_stale(self.directory)
        self.epoch += 1
        self.slot_bytes = slot_bytes
        self.paths = [os.path.join(self.directory, f"{self.name}-s{i}") for i in range(self.nslots)]
        self.ctrl_path = os.path.join(self.directory, f"{self.name}-sc")
        self._finalizer = weakref.finalize(self, _unlink, [*self.paths, self.ctrl_path])
        self.linked = True
        self.buffers = [_create(p, slot_bytes) for p in self.paths]
        self.ctrl = _create(self.ctrl_path, CONTROL_WORDS * 8).numpy().view(np.int64)
        self.next, self.acked = 0, 0

    def describe(self) -> tuple[str, list[str], int, str]:
        return self.name, list(self.paths), self.slot_bytes, self.ctrl_path

    def unlink(self) -> None:
        """Remove the files (mappings stay valid): every receiver of this epoch has mapped them."""
        if self.linked:
            _unlink([*self.paths, self.ctrl_path])
            self.linked = False

    def drop(self) -> None:
        self.unlink()
        if self._finalizer is not None:
            self._finalizer.detach()
        self.buffers = []
        self.ctrl = None

    def wait(self, keys: dict[int, str], timeout_s: float) -> None:
        """Wait for the store key of each rank (the end marker's acknowledgements), polling (0.1 → 5 ms apart):
        a rank still missing once the receivers' side returned is lost (`_gone`); `timeout_s` without them:
        `RuntimeError` naming the ranks."""
        start = checked = time.monotonic()
        pause = 1e-4
        while True:
            with self.acks_lock:
                keys = {r: k for r, k in keys.items() if r not in self.lost and not self.acks.check([k])}
            if not keys:
                return
            now = time.monotonic()
            if now - start > timeout_s:
                raise RuntimeError(f"shared-memory weight sync: receiver rank(s) {sorted(keys)} did not acknowledge "
                                   f"the end of the version within {timeout_s:.0f} s (a replica died or stopped)")
            for r in keys:
                self._gone(r, checked)
            if now - checked >= CHECK_S:
                checked = now
            time.sleep(pause)
            pause = min(pause * 2, 5e-3)

    def wait_acked(self, pending: tuple[int, list[int]] | None) -> None:
        """Wait until every rank's control word reached the piece's ack number (polling, 20 µs → 0.5 ms apart);
        `timeout_s` without it: `RuntimeError` naming the receiver."""
        if not pending or self.ctrl is None:
            return
        ack, ranks = pending
        ctrl, pause, deadline, checked = self.ctrl, 2e-5, None, time.monotonic()
        for r in ranks:
            while int(ctrl[r]) < ack:
                now = time.monotonic()
                if self._gone(r, checked):
                    break
                if now - checked >= CHECK_S:
                    checked = now
                if deadline is None:
                    deadline = now + self.timeout_s
                elif now > deadline:
                    raise RuntimeError(f"shared-memory weight sync: receiver rank {r} did not acknowledge piece "
                                       f"{ack} of ring {self.name} within {self.timeout_s:.0f} s (a replica "
                                       "died or stopped loading)")
                time.sleep(pause)
                pause = min(pause * 2, 5e-4)

    def get(self, size: int, device: Any) -> torch.Tensor:
        if torch.device(device).type != "cpu":
            raise ValueError("shared-memory weight sync packs on the host (device cpu)")
        with self.cond:
            if size > self.slot_bytes or not self.buffers:  # outgrown: wait for every slot, then a new epoch
                self.cond.wait_for(lambda: not self.order)
                for pending in self.pending.values():
                    self.wait_acked(pending)
                self.pending.clear()
                self.renew(max(size, self.slot_bytes))
            slot, self.next = self.next, (self.next + 1) % self.nslots
            k, self.handed = self.handed, self.handed + 1
            self.mark("get", k)
            self.cond.wait_for(lambda: slot not in self.order)  # its bucket is published: its ack is known
            pending = self.pending.pop(slot, None)
        self.wait_acked(pending)  # the receivers are done with the bucket it held
        self.mark("slot", k)
        with self.cond:
            self.order.append(slot)
        return self.buffers[slot][:size]

    def published(self, ranks: list[int]) -> tuple[int, int, tuple[str, list[str], int, str]]:
        """`send` publishes the oldest bucket handed out, whose slot then waits for `ranks` to acknowledge it:
        (slot, the piece's ack number, the ring)."""
        if any(not 0 < r < PID_WORDS for r in ranks):
            raise ValueError(f"shared-memory weight sync: at most {PID_WORDS - 1} receivers")
        with self.cond:
            slot = self.order.popleft()
            self.acked += 1
            self.pending[slot] = (self.acked, list(ranks))
            self.cond.notify_all()
            return slot, self.acked, self.describe()

    def settle(self) -> None:
        """Wait until every receiver acknowledged every published bucket."""
        with self.cond:
            pending, self.pending = self.pending, {}
        for p in pending.values():
            self.wait_acked(p)


class SharedMemorySync(CollectiveSync):
    """`WeightSync` through a shared-memory ring (module docstring), on trainer rank 0. `announce` / `send` as
    for the collective; `publish` (`engine.sync.runtime`) packs into `ring_for(handle)` before `send`."""

    def __init__(self, host: str, port: int, world: int, run_id: str = "run", slot_bytes: int = 0,
                 timeout_s: float = 300.0, per_replica: int = 1, slots: int = SLOTS) -> None:
        super().__init__(host, port, world, "gloo", timeout_s, per_replica, torch.device("cpu"))
        # a random token per sender: its file names never repeat those of an earlier sender of the same run id
        # in this process (epochs restart at 0), so a receiver's mappings, cached by name, are never stale
        safe = f"{re.sub(r'[^A-Za-z0-9_.]', '_', run_id)}-{secrets.token_hex(3)}"
        self.ring = ShmRing(safe, slots, _aligned(max(slot_bytes, ALIGN)), timeout_s=timeout_s)
        self.gen: int | None = None

    def _store(self) -> Any:
        if self.store is None:
            self.store = host_store(self.host, self.port, self.world, self.timeout_s)  # on `host` only
            self.ring.acks = dist.TCPStore(self.host, self.port, is_master=False,
                                           timeout=_dt.timedelta(seconds=self.timeout_s))
        return self.store

    def announce(self, version: int, gen: int = 0, members: list[int] | None = None) -> SharedMemoryHandle:
        world = self.world if members is None else 1 + len(members) * self.per_replica
        return SharedMemoryHandle(version, self.host, self.port, world, "shm", gen=gen,
                                  per_replica=self.per_replica, members=members)

    def ring_for(self, handle: CollectiveHandle) -> ShmRing:
        """The ring the pack of `handle`'s version writes into: a new epoch for a new generation (its members
        may not have mapped the current files)."""
        self._store()
        if self.gen != handle.gen or not self.ring.buffers:
            self.ring.settle()
            self.ring.renew(self.ring.slot_bytes)
            self.gen = handle.gen
        return self.ring

    def send(self, handle: CollectiveHandle, buckets: Iterable[FlatBucket],
             receivers_done: Callable[[], bool] | None = None) -> CollectiveHandle:
        """Publish each bucket (packed into a slot of `ring_for(handle)`), then the end marker; wait until every
        receiver is done with every bucket and unlink the ring's files (every receiver has mapped them). Sets the
        handle's bytes, bucket count and fingerprints. `receivers_done()`: true once the receivers' side of the
        sync returned — a receiver that has not acknowledged by then is not waited for (`ShmRing.lost`)."""
        store, ring, tag = self._store(), self.ring_for(handle), _tag(handle)
        ring.begin(receivers_done, tag)  # (the pack's thread starts with the first bucket asked for below)
        ranks = list(range(1, handle.world))
        keys: list[str] = [f"{tag}/p{r}" for r in ranks]  # (the receivers' pids: `pull`)
        nbytes, sums = 0, []
        for k, fb in enumerate(buckets):
            slot, ack, desc = ring.published(ranks)
            store.set(f"{tag}/h{k}", pickle.dumps((fb.seq, slot, fb.data.numel(), fb.index, desc, ack)))
            ring.mark("published", k)
            keys.append(f"{tag}/h{k}")
            nbytes += fb.nbytes
            sums.append(int(fb.fingerprint))
        end = {r: f"{tag}/a{len(sums)}/{r}" for r in ranks}  # each receiver read the end marker: keys can go
        store.set(f"{tag}/h{len(sums)}", pickle.dumps(None))
        keys += [f"{tag}/h{len(sums)}", *end.values()]
        ring.mark("ended", len(sums))
        ring.settle()
        ring.mark("settled", len(sums))
        ring.wait(end, self.timeout_s)
        ring.mark("end_acked", len(sums))
        ring.unlink()
        for key in keys:
            store.delete_key(key)
        handle.nbytes, handle.fingerprints = nbytes, sums
        handle.num_buckets = len(sums)
        return handle

    def close(self) -> None:
        """Remove the ring's files (the trainer's stop); safe to call twice."""
        self.ring.drop()


_CLIENTS: dict[tuple[str, int], Any] = {}
_PULLED: list[tuple[str, int, float]] = []
"""The timeline of this process's latest `pull` (`pulled_marks`)."""


def pulled_marks() -> list[tuple[str, int, float]]:
    """The receiver's timeline of its latest `pull`: (event, piece, `time.monotonic()`) for "header" (piece k's
    header seen and its slot mapped: the load starts), "loaded" (the consumer asked for the next piece) and
    "acked" (its control word written: the sender may reuse the slot); the end marker's "header"/"acked" carry
    k = the piece count."""
    return list(_PULLED)


def pull(handle: CollectiveHandle, rank: int, timeout_s: float = 300.0) -> Iterator[FlatBucket]:
    """The buckets of `handle` as group rank `rank` (≥ 1) receives them: views of the ring's slots, each
    acknowledged when the consumer asks for the next one (so load it before). A consumer that stops early
    acknowledges the rest unread, so the sender is never left waiting. Its timeline: `pulled_marks`."""
    global _PULLED
    key = (handle.host, handle.port)
    store = _CLIENTS.get(key)
    if store is None:
        store = _CLIENTS[key] = dist.TCPStore(handle.host, handle.port, is_master=False,
                                              timeout=_dt.timedelta(seconds=timeout_s))
    tag, k, done = _tag(handle), 0, False
    marks: list[tuple[str, int, float]] = []
    _PULLED = marks
    clock = time.monotonic

    def header(i: int) -> Any:  # one round trip: `get` waits for the key (up to the store's timeout)
        return pickle.loads(store.get(f"{tag}/h{i}"))

    store.set(f"{tag}/p{rank}", str(os.getpid()))  # found by the sender if this process dies before it maps
    try:
        while True:
            msg = header(k)
            if msg is None:
                marks.append(("header", k, clock()))
                done = True
                store.set(f"{tag}/a{k}/{rank}", b"1")
                marks.append(("acked", k, clock()))
                return
            seq, slot, n, index, ring, ack = msg
            slots, ctrl = _map(ring)
            if k == 0:
                ctrl[PID_WORDS + rank] = os.getpid()  # the sender stops waiting for a process that is gone
            marks.append(("header", k, clock()))
            yield FlatBucket(index, slots[slot][:n], seq)
            marks.append(("loaded", k, clock()))
            ctrl[rank] = ack
            marks.append(("acked", k, clock()))
            k += 1
    finally:
        if not done:  # acknowledge the rest unread, then the end marker
            while True:
                msg = header(k)
                if msg is None:
                    store.set(f"{tag}/a{k}/{rank}", b"1")
                    break
                _map(msg[4])[1][rank] = msg[5]
                k += 1
