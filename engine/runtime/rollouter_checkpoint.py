"""The rollouter's checkpoint cut and resume (a mixin of `engine.runtime.rollouter.RolloutShell`: uses its `lock`,
`loop`, `queue`, `scorer`, `pool`, `_execute`, `_running`)."""

from __future__ import annotations

import time
from typing import Any

from engine.types import TrajectoryGroup

DRAIN_TIMEOUT_S = 60.0
"""Longest wait for generations aborted for a checkpoint cut to come back."""


class RolloutCheckpoints:
    """`snapshot` (the rollout side of a checkpoint) and `_restore` of `RolloutShell`."""

    def snapshot(self, drain: bool = True) -> dict[str, Any]:
        """`{"rollout": positions and counters, "queued": [group json], "in_flight": [prompt state json]}`.
        With `drain` and partial rollout the running generations are aborted and collected first, so the cut
        keeps their partial responses; new dispatches are held meanwhile."""
        with self.lock:
            self._execute(self.loop.begin_hold(drain and self._running))
            deadline = time.monotonic() + DRAIN_TIMEOUT_S
            while self._running and self.loop.aborted and self.loop.train_running() \
                    and time.monotonic() < deadline:
                self.lock.wait(0.05)
            try:
                return self._snapshot_locked()
            finally:
                self._execute(self.loop.end_hold())
                self.lock.notify_all()

    def _snapshot_locked(self) -> dict[str, Any]:
        snap = self.loop.snapshot_state()
        snap["rollout"].update(reward_errors=self.scorer.errors, replica_restarts=self.pool.restarts)
        snap["queued"] = [g.to_json() for g in self.queue.peek_all()]
        return snap

    def _restore(self, resume: dict[str, Any]) -> None:
        """Continue from a snapshot: the loop's state, the reward-error count, and the queued groups."""
        st = resume["rollout"]
        self.loop.restore_state(st, resume["in_flight"], time.monotonic())
        self.scorer.errors = self._reward_errors_seen = int(st.get("reward_errors", 0))
        self.queue.set_max_size(max(self.loop.queue_bound, len(resume["queued"])))
        for g in resume["queued"]:
            self.queue.put(TrajectoryGroup.from_json(g))
        self.loop.queue_seen(self.queue.size())

