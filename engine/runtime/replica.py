"""A rollout replica: a thin Ray actor around one `RolloutBackend`.

It is threaded (`max_concurrency=MAX_CONCURRENCY`): several `generate()` calls may run at once — their
requests join the backend's running batch at the next decode step and each call returns when its own
requests are done — and `abort()` can land while they run: the backend polls the abort flag at every token
boundary and returns every call's unfinished sequences with `finish_reason="abort"`. The flag stays set
until the next `update_weights` or `resume`, so a request dispatched during a sync cannot slip through.
`capacity()` is the number of sequences a new call could add now.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import ray

from engine.rollout.base import SamplingParams
from engine.runtime.backends import build_rollout_backend
from engine.types import GenRequest, GenResult


MAX_CONCURRENCY = 16
"""Threads of a replica actor: concurrent `generate` calls plus the control calls (abort, stats, ...)."""


@ray.remote(max_concurrency=MAX_CONCURRENCY)
class RolloutReplica:
    """One generation engine; `replica_id` names it in the dashboard's workers table."""

    def __init__(self, cfg: Any, model_dir: str, replica_id: int, num_threads: int = 1) -> None:
        import torch

        torch.set_num_threads(max(1, num_threads))
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        self.replica_id = replica_id
        self.backend = build_rollout_backend(cfg, model_dir)
        self._abort = threading.Event()
        self._lock = threading.Lock()
        self._busy_s = 0.0  # time with at least one generate call running
        self._running = 0
        self._busy_since = 0.0
        self._tokens = 0
        self._started = time.monotonic()

    def ready(self) -> int:
        """Returns the replica's pid once the model is loaded."""
        return os.getpid()

    def generate(self, requests: list[GenRequest], sampling: SamplingParams) -> list[GenResult]:
        """Generate `requests` (joining any running batch); returns when they are finished or aborted."""
        with self._lock:
            if self._running == 0:
                self._busy_since = time.monotonic()
            self._running += 1
        try:
            out = self.backend.generate(requests, sampling, should_abort=self._abort.is_set)
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
        return int(self.backend.capacity())

    def abort(self) -> None:
        """Interrupt the running `generate` at the next token boundary (and any before `resume`)."""
        self._abort.set()

    def resume(self) -> None:
        self._abort.clear()

    def update_weights(self, bucket_refs: list, version: int) -> float:
        """Load weights from object-store buckets (refs are resolved by Ray, zero-copy numpy) or, with the
        collective sync, from the trainer's broadcast as it arrives (`engine.sync.runtime`). Returns seconds."""
        from engine.sync.runtime import resolve_buckets

        t0 = time.monotonic()
        buckets = resolve_buckets(bucket_refs, self.replica_id)
        self.backend.update_weights(buckets, version)
        self._abort.clear()
        return time.monotonic() - t0

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
