"""A rollout replica: a thin shell around one `RolloutBackend` (its Ray actor: `engine.runtime.actors.RolloutReplica`).

It is threaded (`max_concurrency=MAX_CONCURRENCY`): several `generate()` calls may run at once — their
requests join the backend's running batch at the next decode step and each call returns when its own
requests are done — and `abort()` can land while they run: the backend polls the abort flag at every token
boundary and returns every training call's unfinished sequences with `finish_reason="abort"` (validation
calls too with `abort(validation=True)`, at a stop). The flags stay set until the next `update_weights` or
`resume`, so a training request dispatched during a sync cannot slip through, while a validation of the
current weights still runs. `capacity()` is the number of sequences a new call could add now; `limits()`
what the rollouter may send at once: `rows` (the backend's batch) and `calls` (`GENERATE_CALLS` for a
backend with continuous batching, 1 for one without a `capacity()`: one batch per call).

Threads: the process starts with the plan's share (`spec.threads`); `set_threads(n)` (elastic cores,
`engine.loop.elastic`) hands `n` to the backend, which applies it in its decode thread at the next decode step;
`threads()` reports what the decode steps ran with.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

from engine.loop.dispatch import STREAM_CALLS
from engine.plan.roles import ReplicaSpec
from engine.rollout.base import SamplingParams
from engine.runtime.backends import build_rollout_backend
from engine.types import GenRequest, GenResult


GENERATE_CALLS = STREAM_CALLS
"""Concurrent `generate` calls the rollouter sends one replica (`engine.loop.dispatch.STREAM_CALLS`, which
`asyncrl plan` models too): the other threads stay free for `abort`, `resume`, `update_weights` and `stats`,
so a sync never waits behind a full thread pool."""
MAX_CONCURRENCY = GENERATE_CALLS + 4
"""Threads of a replica actor: concurrent `generate` calls plus the control calls (abort, stats, ...)."""


BACK_BUFFER_SPARE = 1.0
"""`rollout.weight_sync_back_buffer = "auto"`: the back buffer is allocated only when the device's free memory
is at least (1 + this) × its size, and at least 1 GiB more than it."""


def free_memory(device: Any) -> int:
    """Free bytes on `device`: host `MemAvailable` for cpu, the CUDA allocator's free memory for cuda (0 where
    unknown)."""
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        return int(torch.cuda.mem_get_info(dev)[0])
    if dev.type != "cpu":
        return 0
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _is_shm(bucket_refs: list) -> bool:
    """Whether a sync's refs are a shared-memory handle (whose pull keeps a per-piece timeline)."""
    from engine.sync.shared_memory import SharedMemoryHandle

    return len(bucket_refs) == 1 and isinstance(bucket_refs[0], SharedMemoryHandle)


def killed_mid_transfer(buckets: Iterable[Any], trigger: str) -> Iterator[Any]:
    """Fault injection (`debug.kill_replica_mid_sync_file`): `buckets` as they come, except that when the second
    bucket has arrived — the first received and loaded, the rest of the version still in flight — and the file
    `trigger` exists, this replica claims it (deletes it: one death per file, whichever replica gets there first)
    and kills its own process with SIGKILL, as `kill -9` of a receiver mid-transfer would. A sync of a single
    bucket never fires it (the file waits for the next sync)."""
    it = iter(buckets)
    try:
        for k, bucket in enumerate(it):
            if k == 1:
                try:
                    os.unlink(trigger)
                except OSError:
                    pass
                else:
                    os.kill(os.getpid(), signal.SIGKILL)
            yield bucket
    finally:  # a consumer that stopped: the source acknowledges the rest to its sender (`Delivery.__iter__`)
        close = getattr(it, "close", None)
        if close is not None:
            close()


def back_buffer_fits(nbytes: int, device: Any) -> bool:
    """Whether a back buffer of `nbytes` fits on `device` with room to spare (`BACK_BUFFER_SPARE`)."""
    return free_memory(device) >= nbytes + max(2**30, BACK_BUFFER_SPARE * nbytes)


class ReplicaShell:
    """One generation engine of `spec` (`engine.plan.roles.ReplicaSpec`: its `EngineSpec`, model directory, the plan's
    rollout device and threads); `replica_id` names it in the dashboard's workers table. Ray-free: the Ray actor is
    `engine.runtime.actors.RolloutReplica`; in one process `engine.runtime.peers_local.LocalReplica` calls it."""

    def __init__(self, spec: ReplicaSpec, replica_id: int) -> None:
        import torch

        torch.set_num_threads(max(1, spec.threads))
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        self.replica_id = replica_id
        self.spec = spec
        self._stages: bool | None = None  # `stages_weights`, decided at its first call
        self._staged: tuple[int, list[int], float] | None = None  # (version, bucket fingerprints, seconds)
        self._copy: dict[str, float] = {}  # the last stage's host copy + fingerprint time and bytes (receipts)
        self._nodes: list[Any] = []  # a replica over several nodes: its `ReplicaNode` actors (node ranks 1 …)
        nodes, serving = None, []
        if spec.engine.nodes > 1:
            from engine.runtime.replica_nodes import start_nodes

            nodes, self._nodes, serving = start_nodes(spec.engine, spec.model_dir, spec.device)
        self.backend = build_rollout_backend(spec.engine, spec.model_dir, spec.device, nodes)
        if spec.engine.nodes > 1:
            from engine.runtime.replica_nodes import watch

            watch(self.backend.dead, serving, self._exit)
        self._abort = threading.Event()  # training calls
        self._abort_val = threading.Event()  # validation calls (a stop)
        concurrent = callable(getattr(self.backend, "capacity", None))
        rows = int(self.backend.capacity()) if concurrent else int(spec.engine.max_num_seqs)
        self._limits = {"rows": max(1, rows), "calls": GENERATE_CALLS if concurrent else 1}
        self._lock = threading.Lock()
        self._busy_s = 0.0  # time with at least one generate call running
        self._running = 0
        self._busy_since = 0.0
        self._tokens = 0
        self._started = time.monotonic()

    def ready(self) -> int:
        """Returns the replica's pid once the model is loaded."""
        return os.getpid()

    def generate(self, requests: list[GenRequest], sampling: SamplingParams, kind: str = "train") -> list[GenResult]:
        """Generate `requests` (joining any running batch); returns when they are finished or aborted.
        `kind` "val": a validation call, aborted only by `abort(validation=True)`."""
        flag = self._abort_val if kind == "val" else self._abort
        with self._lock:
            if self._running == 0:
                self._busy_since = time.monotonic()
            self._running += 1
        try:
            out = self.backend.generate(requests, sampling, should_abort=flag.is_set)
        except Exception:
            if self.spec.engine.nodes > 1 and self.backend.dead():  # the watchdog's decision, taken at once: a
                self._exit("its vLLM engine died (a worker process ended)")  # call must not outrun it
            raise
        finally:
            with self._lock:
                self._running -= 1
                if self._running == 0:
                    self._busy_s += time.monotonic() - self._busy_since
        with self._lock:
            self._tokens += sum(r.new_tokens for r in out)
        return out

    def capacity(self) -> int:
        """Sequences a new `generate` call could add to the running batch now."""
        if self._limits["calls"] == 1:
            return self._limits["rows"] if self._running == 0 else 0
        return int(self.backend.capacity())

    def limits(self) -> dict[str, int]:
        """`{"rows", "calls"}`: what the rollouter may have out on this replica at once."""
        return dict(self._limits)

    def abort(self, validation: bool = False) -> None:
        """Interrupt the running training `generate` calls at the next token boundary (and any before
        `resume`); with `validation` the validation calls too."""
        self._abort.set()
        if validation:
            self._abort_val.set()

    def resume(self) -> None:
        self._abort.clear()
        self._abort_val.clear()

    def update_weights(self, bucket_refs: list, version: int) -> dict[str, Any]:
        """Load weights from object-store buckets (refs are resolved by Ray, zero-copy) or, with the collective
        sync, from the trainer's broadcast as it arrives (`engine.sync.runtime`). Returns the receipt the
        trainer checks (`engine.sync.verify`): the fingerprint of every bucket received, a sample fingerprint of
        the weights now loaded, and the seconds it took."""
        t0 = time.monotonic()
        delivery = self._delivery(bucket_refs)
        self.backend.update_weights(delivery, version)
        self._abort.clear()
        self._abort_val.clear()
        return {"fingerprints": delivery.fingerprints, "weights": self.backend.weights_fingerprint(),
                "seconds": time.monotonic() - t0, **self._worker_receipts(delivery)}

    def _worker_receipts(self, delivery: Any) -> dict[str, Any]:
        """A multi-process replica's (vLLM: every worker on every node) per-worker receipt: each worker's bucket
        fingerprints, the number of workers it has and each one's weight sample (`engine.sync.verify`)."""
        by_worker = getattr(self.backend, "worker_weights", None)
        if delivery.workers is None or not callable(by_worker):
            return {}
        return {"workers": delivery.workers, "world": self.backend.world_size, "worker_weights": by_worker()}

    def _delivery(self, bucket_refs: list) -> Any:
        """The sync's buckets for this replica (`engine.sync.runtime.resolve_buckets`), through the mid-transfer
        fault when `debug.kill_replica_mid_sync_file` is set."""
        from engine.sync.runtime import resolve_buckets

        delivery = resolve_buckets(bucket_refs, self.replica_id)
        trigger = self.spec.faults.kill_replica_mid_sync_file
        if trigger:
            delivery.buckets = killed_mid_transfer(delivery.buckets, trigger)
        return delivery

    def stages_weights(self) -> bool:
        """Whether this replica receives a sync into a back buffer while it generates (`stage_weights`, then
        `swap_weights` at the pause) — `rollout.weight_sync_back_buffer`: "on", "off", or "auto" = on when the
        backend can and the device's free memory holds the back buffer with as much again to spare (decided
        once, at the first call, and the buffer allocated then)."""
        if self._stages is None:
            mode = self.spec.engine.back_buffer
            can = callable(getattr(self.backend, "stage_weights", None))
            if mode == "on" and not can:
                raise ValueError('rollout.weight_sync_back_buffer = "on" needs rollout.backend = "hf"')
            stages = can and (mode == "on" or (mode == "auto" and back_buffer_fits(
                self.backend.back_buffer_bytes(), self.backend.device)))
            if stages:
                self.backend.allocate_back_buffer()
            self._stages = stages
        return self._stages

    def stage_weights(self, bucket_refs: list, version: int) -> dict[str, Any]:
        """Receive `version` (as `update_weights` does) into the back buffer while generation goes on with the
        loaded weights; returns {"seconds"}. The receipt comes with `swap_weights`."""
        from engine.sync.flat import copy_stats
        from engine.sync.shared_memory import pulled_marks

        t0 = time.monotonic()
        self._staged = None
        c0 = copy_stats()
        delivery = self._delivery(bucket_refs)
        self.backend.stage_weights(delivery, version)
        c1 = copy_stats()
        t1 = time.monotonic()
        self._staged = (version, delivery.fingerprints, t1 - t0)
        self._copy = {"copy_s": c1[0] - c0[0], "copy_bytes": c1[1] - c0[1]}  # the host copies' busy time
        # the stage's timeline (monotonic seconds, comparable across processes on this host): its start and end,
        # and for a shared-memory sync each piece's header seen / loaded / acknowledged
        timeline = {"stage": [t0, t1], "pull": pulled_marks() if _is_shm(bucket_refs) else []}
        return {"seconds": self._staged[2], **self._copy, "timeline": timeline}

    def swap_weights(self, version: int) -> dict[str, Any]:
        """Make the staged `version` live (a storage swap, between two decode steps; the rollouter calls it once
        generation is paused) and clear the abort flags. Returns the receipt `update_weights` returns: the
        fingerprints of the buckets staged, a sample fingerprint of the weights now live, and the seconds
        (staging + swap; `swap_s` the swap alone)."""
        if self._staged is None or self._staged[0] != version:
            raise RuntimeError(f"rollout replica {self.replica_id}: asked to swap in weights v{version}, staged "
                               f"{'nothing' if self._staged is None else f'v{self._staged[0]}'}")
        _, fingerprints, stage_s = self._staged
        t0 = time.monotonic()
        self.backend.swap_weights(version)
        self._staged = None
        t1 = time.monotonic()
        swap_s = t1 - t0
        self._abort.clear()
        self._abort_val.clear()
        weights = self.backend.weights_fingerprint()
        return {"fingerprints": fingerprints, "weights": weights, "seconds": stage_s + swap_s, "swap_s": swap_s,
                **self._copy, "swap_marks": [t0, t1, time.monotonic()]}

    def version(self) -> int:
        return self.backend.version

    def set_threads(self, n: int) -> None:
        """Elastic cores: compute with `n` intra-op threads from the next decode step on (a backend without
        `set_threads`, e.g. vLLM, keeps its own)."""
        setter = getattr(self.backend, "set_threads", None)
        if callable(setter):
            setter(int(n))

    def threads(self) -> dict[str, float]:
        """`{"applied", "mean"}`: the threads of the last decode step, and their mean over the decode steps since
        the last call (the plan's share for a backend that does not report them)."""
        take = getattr(self.backend, "take_thread_stats", None)
        if callable(take):
            return take()
        n = float(max(1, self.spec.threads))
        return {"applied": n, "mean": n}

    def _exit(self, cause: str) -> None:
        """End this replica's process (a replica over several nodes lost a worker: `engine.runtime.replica_nodes`);
        the rollouter replaces it."""
        import sys

        print(f"asyncrl: rollout replica {self.replica_id}: {cause}; its process exits", file=sys.stderr, flush=True)
        os._exit(1)

    def debug_exit(self) -> None:
        """Fault injection (`debug.kill_replica_at_step`): the process exits at once, as a crash would."""
        os._exit(1)

    def stats(self) -> dict[str, float]:
        now = time.monotonic()
        up = max(1e-9, now - self._started)
        with self._lock:
            busy = self._busy_s + (now - self._busy_since if self._running else 0.0)
        return {
            "replica_id": self.replica_id,
            "version": self.backend.version,
            "tokens": self._tokens,
            "busy_ratio": busy / up,
            "tokens_per_s": self._tokens / max(1e-9, busy),
            "capacity": self.capacity(),
        }
