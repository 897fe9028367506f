"""A rollout replica: a thin Ray actor around one `RolloutBackend`.

It is threaded (`max_concurrency=MAX_CONCURRENCY`): several `generate()` calls may run at once — their
requests join the backend's running batch at the next decode step and each call returns when its own
requests are done — and `abort()` can land while they run: the backend polls the abort flag at every token
boundary and returns every training call's unfinished sequences with `finish_reason="abort"` (validation
calls too with `abort(validation=True)`, at a stop). The flags stay set until the next `update_weights` or
`resume`, so a training request dispatched during a sync cannot slip through, while a validation of the
current weights still runs. `capacity()` is the number of sequences a new call could add now; `limits()`
what the rollouter may send at once: `rows` (the backend's batch) and `calls` (`GENERATE_CALLS` for a
backend with continuous batching, 1 for one without a `capacity()`: one batch per call).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import ray

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


@ray.remote(max_concurrency=MAX_CONCURRENCY)
class RolloutReplica:
    """One generation engine of `spec` (`engine.plan.roles.ReplicaSpec`: config, model directory, the plan's rollout
    device and threads); `replica_id` names it in the dashboard's workers table."""

    def __init__(self, spec: ReplicaSpec, replica_id: int) -> None:
        import torch

        torch.set_num_threads(max(1, spec.threads))
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        self.replica_id = replica_id
        self.backend = build_rollout_backend(spec.config, spec.model_dir, spec.device)
        self._abort = threading.Event()  # training calls
        self._abort_val = threading.Event()  # validation calls (a stop)
        concurrent = callable(getattr(self.backend, "capacity", None))
        rows = int(self.backend.capacity()) if concurrent else int(spec.config.rollout.max_num_seqs)
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
        from engine.sync.runtime import resolve_buckets

        t0 = time.monotonic()
        delivery = resolve_buckets(bucket_refs, self.replica_id)
        self.backend.update_weights(delivery, version)
        self._abort.clear()
        self._abort_val.clear()
        return {"fingerprints": delivery.fingerprints, "weights": self.backend.weights_fingerprint(),
                "seconds": time.monotonic() - t0}

    def version(self) -> int:
        return self.backend.version

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
