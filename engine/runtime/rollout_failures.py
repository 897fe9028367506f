"""Rollout replica failures, for `RolloutCore` (mixed in; it uses the core's lock, tables, pool and events).

A dispatch whose replica died (`RayActorError` from its `generate`) is put back: its train requests become
pending again with the prefix they were sent with, its validation requests go back in front. The pool then
starts a replacement (which gets the newest weights before it is used) or, with `rollout.max_replica_restarts`
spent, the core records `failure` and its loop ends; the driver then stops the trainer with a checkpoint.
Every failure, restart and replacement is an event of kind `replica`. All methods run under `self.lock`.
"""

from __future__ import annotations

from typing import Any


class RolloutFailureMixin:
    """Re-queueing, replacement and fault injection for `RolloutCore`."""

    def _requeue(self: Any, info: Any) -> None:
        """Put a lost dispatch's requests back: train ones as pending (same prefix), val ones in front."""
        if info.kind == "val":
            self._val_pending = list(info.requests) + self._val_pending
            return
        for req in info.requests:
            uid, idx = req.request_id.rsplit("#", 1)
            st = self.in_flight.get(uid)
            if st is not None:
                st.running.discard(int(idx))
                st.pending[int(idx)] = req

    def _replica_failed(self: Any, rid: int, cause: str, requeued: int = 0) -> None:
        """Log the failure and start a replacement, or record the run's failure when the budget is spent."""
        if self.pool.fail(rid, cause):
            self._event("warning", "replica", f"rollout replica {rid} died ({cause}); {requeued} request(s) "
                        f"re-queued; starting a replacement (restart {self.pool.restarts}/"
                        f"{self.pool.max_restarts})", replica=rid, phase="restart", cause=cause)
            return
        self.failure = self.pool.exhausted
        self._event("error", "replica", f"{self.failure}; stopping the run", replica=rid, phase="exhausted",
                    cause=cause)
        self.lock.notify_all()

    def _poll_pool(self: Any) -> None:
        for rid, cause in self.pool.poll():
            if cause is None:
                self._event("info", "replica", f"replacement rollout replica {rid} is up with weights "
                            f"v{self.pool.latest[0] if self.pool.latest else 0}", replica=rid, phase="replaced")
            else:
                self._replica_failed(rid, f"replacement failed to start: {cause}")

    def _maybe_kill_replica(self: Any, step: int) -> None:
        """Fault injection (`debug.kill_replica_at_step`): replica 0's process exits once the step is reached."""
        if self._kill_at and not self._killed and step >= self._kill_at and 0 not in self.pool.down:
            self._killed = True
            self._event("warning", "fault", f"fault injection: killing rollout replica 0 at step {step} "
                        "(debug.kill_replica_at_step)")
            self.pool.replicas[0].debug_exit.remote()
