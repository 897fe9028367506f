"""A rollout replica: a thin Ray actor around one `RolloutBackend`.

It is threaded (`max_concurrency=2`) so that `abort()` can land while `generate()` runs: the backend polls the
abort flag at every token boundary and returns the unfinished sequences with `finish_reason="abort"`. The
flag stays set until the next `update_weights` or `resume`, so a request dispatched during a sync cannot slip
through.
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


@ray.remote(max_concurrency=2)
class RolloutReplica:
    """One generation engine; `replica_id` names it in the dashboard's workers table."""

    def __init__(self, cfg: Any, model_dir: str, replica_id: int, num_threads: int = 1) -> None:
        import torch

        torch.set_num_threads(max(1, num_threads))
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        self.replica_id = replica_id
        self.backend = build_rollout_backend(cfg, model_dir)
        self._abort = threading.Event()
        self._busy_s = 0.0
        self._tokens = 0
        self._started = time.monotonic()

    def ready(self) -> int:
        """Returns the replica's pid once the model is loaded."""
        return os.getpid()

    def generate(self, requests: list[GenRequest], sampling: SamplingParams) -> list[GenResult]:
        t0 = time.monotonic()
        out = self.backend.generate(requests, sampling, should_abort=self._abort.is_set)
        self._busy_s += time.monotonic() - t0
        self._tokens += sum(r.new_tokens for r in out)
        return out

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
        up = max(1e-9, time.monotonic() - self._started)
        return {
            "replica_id": self.replica_id,
            "version": self.backend.version,
            "tokens": self._tokens,
            "busy_ratio": self._busy_s / up,
            "tokens_per_s": self._tokens / max(1e-9, self._busy_s),
        }
