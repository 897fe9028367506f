"""The rollouter's knobs, replica pool, worker states and reports (a mixin of
`engine.runtime.rollouter.RolloutShell`: uses its `lock`, `loop`, `pool`, `controller`, `inbox`, `elastic`,
`scorer`, `tools` and counters): knob changes polled from the controller twice a second, replacement replicas
reported to the loop, the workers' states pushed once a second, the per-step counters, and events."""

from __future__ import annotations

import time
from typing import Any

from engine.runtime.peers import PeerDied
from engine.runtime.scoring import filtered_message, reward_errors_message
from engine.telemetry.events import run_event


KNOB_POLL_S = 10.0
"""Longest wait of the rollouter's knob poll on the run's controller (the dispatch thread must not hang on it)."""


class RolloutReports:
    """Knobs, replica failures, worker states, `report()` and events of `RolloutShell`."""

    def _poll_knobs(self, now: bool = False) -> None:
        """Every 0.5 s (`now`: at once, as at a sync): the knob changes routed to the rollouter — owned ones
        applied and acknowledged, the trainer's applied sync interval followed."""
        t = time.monotonic()
        if not now and t - self._last_knob_poll < 0.5:
            return
        self._last_knob_poll = t
        try:
            knobs = self.controller.get_knobs(timeout=KNOB_POLL_S)
        except TimeoutError:  # a stalled controller: keep generating; the trainer's own poll fails the run
            return
        with self.lock:  # the dispatch thread and a sync may both poll: the inbox is read under the lock
            changes = self.inbox.take(knobs)
            for k in changes:  # routed by engine.loop.knobs: applied at once and acknowledged, refused, or followed
                self._execute(self.loop.knob(k))
            if changes:
                self.lock.notify_all()

    def _poll_pool(self) -> None:
        for rid, cause in self.pool.poll():
            if cause is None:
                self._execute(self.loop.replica_up(rid))
                self._event("info", "replica", f"replacement rollout replica {rid} is up with weights "
                            f"v{self.pool.latest[0] if self.pool.latest else 0}", replica=rid, phase="replaced")
            else:
                self._replica_failed(rid, f"replacement failed to start: {cause}")

    def _replica_failed(self, rid: int, cause: str, requeued: int = 0) -> None:
        """Log the failure and start a replacement, or record the run's failure when the budget is spent."""
        if self.pool.fail(rid, cause):
            self._event("warning", "replica", f"rollout replica {rid} died ({cause}); {requeued} request(s) "
                        f"re-queued; starting a replacement (restart {self.pool.restarts}/"
                        f"{self.pool.max_restarts})", replica=rid, phase="restart", cause=cause)
            return
        self.failure = self.pool.exhausted
        self._event("error", "replica", f"{self.failure}; stopping the run", replica=rid, phase="exhausted",
                    cause=cause)

    def _maybe_kill_replica(self, step: int) -> None:
        """Fault injection (`debug.kill_replica_at_step`): replica 0's process exits once the step is reached."""
        if self._kill_at and not self._killed and step >= self._kill_at and 0 not in self.pool.down:
            self._killed = True
            self._event("warning", "fault", f"fault injection: killing rollout replica 0 at step {step} "
                        "(debug.kill_replica_at_step)")
            call = self.pool.replicas[0].debug_exit()
            try:  # wait until the process is gone, so the injected death precedes the next sync
                call.result(timeout=30)
            except (PeerDied, TimeoutError):
                pass

    def _push_workers(self) -> None:
        now = time.monotonic()
        if now - self._last_worker_push < 1.0:
            return
        self._last_worker_push = now
        loop = self.loop
        for rid in range(len(self.pool)):
            state = "restarting" if rid in self.pool.down else "syncing" if loop.sync is not None else \
                "paused" if loop.paused else "busy" if rid in loop.running else "idle"
            self.controller.update_worker(f"rollout-{rid}", {"kind": "rollout", "state": state, "version": loop.version})

    def report(self, step: int | None = None) -> dict[str, float]:
        """Counters for the trainer's per-step record (`step`: the trainer's local step just finished)."""
        threads: dict[str, float] = {}
        if self.elastic.p.enabled:  # what the replicas' decode steps ran with since the last report
            seen = self.replica_threads()
            if seen:
                threads["asyncrl/threads/rollout"] = sum(t["mean"] for t in seen) / len(seen)
            threads["asyncrl/elastic/lends/trainer"] = self.elastic.lends["trainer"]
            threads["asyncrl/elastic/lends/rollout"] = self.elastic.lends["rollout"]
        with self.lock:
            if step is not None:
                self.loop.step = step
                self._maybe_kill_replica(step)
            now = time.monotonic()
            tps = self.tokens_since_report / max(1e-9, now - self.last_report)
            self.tokens_since_report, self.last_report = 0, now
            loop = self.loop
            return {
                "fully_async/count/total_generated_samples": loop.total_generated,
                "fully_async/count/staleness_samples": loop.budget.staleness_samples,
                "fully_async/count/dropped_stale_samples": len(loop.dropped),
                "fully_async/monitor/active_tasks_size": len(loop.in_flight),
                "fully_async/static/max_required_samples": loop.budget.limit,
                "asyncrl/rollout/tokens_per_s": tps,
                "asyncrl/rollout/version": loop.version,
                "asyncrl/rollout/replica_restarts": self.pool.restarts,
                **self._counters,
                **threads,
                **self.scorer.counters(),
                **(self.tools.counters() if self.tools is not None else {}),
            }

    def _report_filtered(self, epoch: int, counters: dict[str, int]) -> None:
        """An event when rendering dropped prompts (empty, or over data.max_prompt_length): once per run."""
        message = filtered_message(epoch, counters)
        if message and not self._filtered_reported:
            self._filtered_reported = True
            self._event("warning", "data", message, **{k: v for k, v in counters.items() if k.startswith("filtered")})

    def _report_reward_errors(self) -> None:
        """An event when the reward function's failure count reaches 1, 10, 100, ... (scored 0.0 each)."""
        message = reward_errors_message(self._reward_errors_seen, self.scorer.errors, self.scorer.last_error)
        self._reward_errors_seen = self.scorer.errors
        if message:
            self._event("warning", "reward", message, errors=self.scorer.errors)

    def _event(self, level: str, kind: str, message: str, **extra: Any) -> None:
        self.controller.record_event(run_event(level, kind, message, self.loop.step, self.loop.version, **extra))

