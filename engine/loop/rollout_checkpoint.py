"""The rollout side of a checkpoint in `RolloutLoop` (a mixin of it): positions, counters and the unfinished
prompts, and the restore that makes every unfinished trajectory pending again."""

from __future__ import annotations

from typing import Any

from engine.loop.inflight import in_flight_from_json, in_flight_to_json


class RolloutCheckpoint:
    """`snapshot_state` / `restore_state` of `RolloutLoop`."""

    def snapshot_state(self) -> dict[str, Any]:
        """The rollout side of a checkpoint (the shell adds the queued groups)."""
        dispatched = {r.request_id: r for run in self.dispatches.by_id.values() if run.kind == "train"
                      for r in run.requests}
        return {
            "rollout": {
                "version": self.version, "step": self.step, "stream": self.stream.state(),
                "staleness_samples": self.budget.staleness_samples, "total_generated": self.total_generated,
                "dropped_with_reason": [list(d) for d in self.dropped],
                "evicted": [u for u, why in self.dropped if why == "queue_overflow"],
                "dropped": len(self.dropped),
                "trigger": self.budget.trigger, "staleness_threshold": self.budget.staleness_threshold,
            },
            "in_flight": [in_flight_to_json(st, dispatched) for st in self.in_flight.values()],
        }

    def restore_state(self, state: dict[str, Any], in_flight: list[dict[str, Any]], now: float) -> None:
        """Continue from `snapshot_state()`'s output: every unfinished trajectory is pending again."""
        st = state
        self.version, self.step = int(st["version"]), int(st["step"])
        self.stream.restore(st["stream"])
        self.total_generated = int(st["total_generated"])
        if "dropped_with_reason" in st:
            self.dropped = [(u, why) for u, why in st["dropped_with_reason"]]
        else:  # checkpoints of earlier versions kept only the evicted uids
            self.dropped = [(u, "queue_overflow") for u in st.get("evicted", [])]
        self.budget.set_knobs(trigger=st.get("trigger"), staleness_threshold=None if self.p.sync_mode
                              else st.get("staleness_threshold"))
        for d in in_flight:
            s = in_flight_from_json(d, n=self.p.n, max_new_tokens=self.p.max_new_tokens,
                                    keep_prefixes=self.p.partial_rollout, now=now, agent=self.p.agent)
            self.in_flight[s.prompt.uid] = s
        self.budget.staleness_samples = int(st["staleness_samples"])
        self._bound_changed()
