"""The rollout side of a checkpoint: a consistent cut of the rollouter and the queue, and its restore.

Mixed into `RolloutCore` (it uses the core's lock, in-flight table, dispatch table, pool and stream).

Consistency: every put into the MessageQueue happens under the rollouter's lock, the trainer (the only
consumer) is the one asking for the snapshot, and admission moves the stream position under the same lock,
so the queue contents, the in-flight prompts and the stream position read under the lock belong to one
instant: each admitted prompt is in exactly one of {trained or dropped before (the ledger), the trainer's
buffer, the queue, in flight}. With `drain` and partial rollout the running generations are first aborted at
their next token boundary and collected (new dispatches are held meanwhile), so the checkpoint keeps their
partial responses, not only what was dispatched; the replicas then resume.
"""

from __future__ import annotations

import time
from typing import Any

import ray

from engine.runtime.rollout_state import in_flight_from_json, in_flight_to_json
from engine.types import TrajectoryGroup

DRAIN_TIMEOUT_S = 60.0
"""Longest wait for aborted generations to come back; whatever is still out is saved as dispatched."""


class RolloutCheckpointMixin:
    """`snapshot()` and `restore()` for `RolloutCore`."""

    def snapshot(self: Any, drain: bool = True) -> dict[str, Any]:
        """`{"rollout": positions and counters, "queued": [group json], "in_flight": [prompt state json]}`."""
        aborted: list[int] = []
        with self.lock:
            self._snapshotting = True
            if drain and self.partial_rollout and self._running and not self._stopped:
                aborted = sorted({d.replica for d in self.dispatch.values() if d.kind == "train"})
        try:
            if aborted:
                self._wait_signal(aborted, "abort")
                deadline = time.monotonic() + DRAIN_TIMEOUT_S
                with self.lock:
                    while self._running and time.monotonic() < deadline and \
                            any(d.kind == "train" for d in self.dispatch.values()):
                        self.lock.wait(0.05)
            with self.lock:
                snap = self._snapshot_locked()
            if aborted:
                self._wait_signal(aborted, "resume")
        finally:
            with self.lock:
                self._snapshotting = False
                self.lock.notify_all()
        return snap

    def _snapshot_locked(self: Any) -> dict[str, Any]:
        """The cut itself; the caller holds `self.lock`."""
        dispatched = {r.request_id: r for d in self.dispatch.values() if d.kind == "train" for r in d.requests}
        queued = ray.get(self.queue.peek_all.remote())
        return {
            "rollout": {
                "version": self.version,
                "step": self.step,
                "stream": self.stream.state(),
                "staleness_samples": self.budget.staleness_samples,
                "total_generated": self.total_generated,
                "dropped": self.dropped,
                "reward_errors": self.scorer.errors,
                "evicted": list(self.evicted_uids),
                "replica_restarts": self.pool.restarts,
            },
            "queued": [g.to_json() for g in queued],
            "in_flight": [in_flight_to_json(st, dispatched) for st in self.in_flight.values()],
        }

    def restore(self: Any, resume: dict[str, Any]) -> None:
        """Continue from a snapshot: stream position, counters, in-flight prompts (all pending again, with
        their saved prefixes when partial rollout is on) and the queued groups, put back into the queue."""
        st = resume["rollout"]
        self.version, self.step = int(st["version"]), int(st["step"])
        self.stream.restore(st["stream"])
        self.total_generated, self.dropped = int(st["total_generated"]), int(st["dropped"])
        self.scorer.errors = self._reward_errors_seen = int(st["reward_errors"])
        self.evicted_uids = list(st["evicted"])
        now = time.monotonic()
        for d in resume["in_flight"]:
            prompt_state = in_flight_from_json(d, n=self.n, max_new_tokens=self.max_new,
                                               keep_prefixes=self.partial_rollout, now=now)
            self.in_flight[prompt_state.prompt.uid] = prompt_state
        for g in resume["queued"]:
            evicted = ray.get(self.queue.put.remote(TrajectoryGroup.from_json(g)))
            if evicted is not None:  # the queue bound shrank since the checkpoint
                self.dropped += 1
                self.evicted_uids.append(evicted.prompt.uid)
        self._queue_size = ray.get(self.queue.size.remote())
        self.budget.staleness_samples = int(st["staleness_samples"])
