"""The rollouter's admission budget: verl's freshness / staleness rule, as a small pure state machine.

With `R = required_samples` prompts per local step, `N = trigger_parameter_sync_step` local steps per sync and
`s = staleness_threshold`, the rollouter may start at most

    max_required_samples = int(R · (1 + s) · N)

prompts per parameter version. `staleness_samples` counts prompts admitted since the last sync; at every sync
it is reset to the prompts still in flight or queued (they carry over as stale), so between two syncs at most
`max_required_samples − carried_over` new prompts start. Admission also pauses while the queue holds
`max_queue_size` groups. `s = 0` makes the rollouter produce exactly one sync cycle's worth of prompts.
"""

from __future__ import annotations

from dataclasses import dataclass


def max_required_samples(required_samples: int, staleness_threshold: float, trigger: int) -> int:
    """int(R · (1 + s) · N), as verl's `FullyAsyncRollouter.set_max_required_samples`."""
    return int(required_samples * (1 + staleness_threshold) * trigger)


@dataclass
class StalenessBudget:
    """Counts admitted prompts against the per-version budget."""

    required_samples: int
    staleness_threshold: float
    trigger: int
    staleness_samples: int = 0

    @property
    def limit(self) -> int:
        return max_required_samples(self.required_samples, self.staleness_threshold, self.trigger)

    def can_admit(self, queue_size: int, max_queue_size: int) -> bool:
        """True while neither the per-version budget nor the queue bound is reached."""
        return self.staleness_samples < self.limit and queue_size < max_queue_size

    def admit(self) -> None:
        self.staleness_samples += 1

    def on_sync(self, in_flight: int, queued: int, *, trigger: int | None = None,
                staleness_threshold: float | None = None) -> None:
        """Reset at a weight sync: in-flight and queued prompts carry over. Knob changes take effect here."""
        if trigger is not None:
            self.trigger = trigger
        if staleness_threshold is not None:
            self.staleness_threshold = staleness_threshold
        self.staleness_samples = in_flight + queued
