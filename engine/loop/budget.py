"""The rollouter's admission budget: verl's freshness / staleness rule, as a small pure state machine.

With `R = required_samples` prompts per local step, `N = trigger_parameter_sync_step` local steps per sync and
`s = staleness_threshold`, the rollouter may start at most

    max_required_samples = int(R · (1 + s) · N)

prompts per parameter version. `staleness_samples` counts prompts admitted since the last sync; at every sync
it is reset to the prompts still in flight, queued or held in the trainer's buffer (pulled, not yet trained:
`Sync.held`) — they all carry over as stale — so between two syncs at most `max_required_samples −
carried_over` new prompts start. `s = 0` makes the rollouter produce exactly one sync cycle's worth of prompts.

Accounting invariant: `staleness_samples` ≥ the prompts counted in it that are neither trained nor dropped yet
(in flight + queued + in the trainer's buffer). Admission adds one to both sides, a drop (`release`) takes one
from both, training takes one from the right only. Hence `release` never frees budget that was not counted
(a group held across a sync and dropped after it was counted at that sync), the queue never holds more than
the counter, and the queue bound (≥ the counter) never blocks an admission the budget allows — which the
deterministic schedule relies on: its sync waits for the budget to be used up.

Liveness. The trainer needs at most `N · R` prompts per version and the budget lets `≥ N · R` reach it, as
long as every admitted prompt reaches the trainer. Two things keep that true:
- a prompt that will never reach the trainer (dropped: stale, aborted at a sync, evicted) is `release`d;
- a knob change (N or s) takes effect here at once — at the trainer's local-step boundary — not at the next
  sync, which a raised N would otherwise never let come;
- while the trainer postpones a sync (`stale_policy = "wait"`) it may `allow` exactly the prompts its next
  step still lacks, so the postponement always ends.
"""

from __future__ import annotations

from dataclasses import dataclass


def staleness_in_force(staleness_threshold: float, sync_mode: bool) -> float:
    """The threshold the budget uses: 0 in sync mode (generate → train → sync, strictly alternating), else the
    configured one (the run plan's `Derived.staleness_threshold` and the simulator both take it from here)."""
    return 0.0 if sync_mode else float(staleness_threshold)


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
    extra: int = 0
    """Prompts allowed beyond the limit while the trainer postpones a sync (`allow`)."""

    @property
    def limit(self) -> int:
        return max_required_samples(self.required_samples, self.staleness_threshold, self.trigger)

    def can_admit(self) -> bool:
        """True while the per-version budget (plus any allowance) is not used up."""
        return self.staleness_samples < self.limit + self.extra

    def admit(self) -> None:
        self.staleness_samples += 1

    def release(self, k: int = 1) -> None:
        """`k` admitted prompts will never reach the trainer: they no longer use the budget."""
        self.staleness_samples = max(0, self.staleness_samples - k)

    def allow(self, k: int) -> None:
        """While a sync is postponed: at least `k` more prompts may start beyond the limit."""
        self.extra = max(self.extra, self.staleness_samples + k - self.limit, 0)

    def set_knobs(self, *, trigger: int | None = None, staleness_threshold: float | None = None) -> None:
        """A knob change, in force from now on."""
        if trigger is not None:
            self.trigger = trigger
        if staleness_threshold is not None:
            self.staleness_threshold = staleness_threshold

    def on_sync(self, in_flight: int, queued: int) -> None:
        """Reset at a weight sync: in-flight and queued prompts (`queued` includes the trainer's buffer) carry
        over."""
        self.extra = 0
        self.staleness_samples = in_flight + queued
