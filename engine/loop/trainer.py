"""`TrainerLoop`: the trainer's decisions, as a pure state machine (no Ray, torch or clock).

The trainer takes one local step on `R = required_samples` prompt groups and syncs every `N =
trigger_parameter_sync_step` local steps (the parameter version counts syncs). This object decides how many
groups to pull (`want`), which of a batch the hard staleness cap drops (`take_batch`), whether the sync is
due, postponed or not yet (`sync_decision`), and applies the live sync interval at a local-step boundary
(`set_trigger`). The shell (the `Trainer` actor, or the simulator) pulls, trains and pushes weights.

Staleness of a group trained at version `v`: `v − min_version` (the oldest weights that produced any of its
tokens). With `max_staleness_versions = c`:
- `stale_policy = "drop"`: a group with staleness > c is dropped (and released from the rollout budget);
- `stale_policy = "wait"`: the sync to `v + 1` is postponed while any outstanding group (queued, in flight,
  or in the trainer's buffer) has `v + 1 − min_version > c`; meanwhile the trainer keeps training at `v` and
  lets the rollouter admit just the prompts its next step lacks, so outstanding work drains and the sync comes.
In sync mode the trainer pulls a whole cycle (`N · R` groups) before its first step of a version.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TrainerParams:
    """What the trainer loop needs from a run's config."""

    required_samples: int
    trigger: int
    total_local_steps: int
    sync_mode: bool = False
    max_staleness_versions: int | None = None
    stale_policy: str = "drop"
    checkpoint_every_versions: int = 0
    ordered: bool = False
    """`trainer.deterministic`: a batch's groups are ordered by prompt (epoch, index), not by arrival."""

    @classmethod
    def from_config(cls, cfg: Any, total_local_steps: int) -> "TrainerParams":
        ac = cfg.async_training
        return cls(required_samples=cfg.trainer.ppo_mini_batch_size * ac.require_batches,
                   trigger=ac.trigger_parameter_sync_step, total_local_steps=total_local_steps,
                   sync_mode=ac.mode == "sync", max_staleness_versions=ac.max_staleness_versions,
                   stale_policy=ac.stale_policy, checkpoint_every_versions=cfg.checkpoint.every_versions,
                   ordered=bool(getattr(cfg.trainer, "deterministic", False)))


@dataclass(frozen=True)
class SyncDecision:
    """`action`: "none" (not due), "sync", or "postpone" (with `need`: prompts the next step lacks)."""

    action: str
    need: int = 0


def staleness_of(group: Any, version: int) -> int:
    """Staleness of a group trained at `version`: version − its oldest generating version."""
    return version - group.min_version


class TrainerLoop:
    """The trainer's state machine (see the module docstring). `buffer` holds pulled, untrained groups."""

    def __init__(self, params: TrainerParams) -> None:
        self.p = params
        self.trigger = params.trigger
        self.version = 0
        self.local_step = 0
        self.since_sync = 0
        self.buffer: list[Any] = []
        self.closed = False
        self.stopping = False
        self.postponed = False
        self.dropped_stale = 0

    # ------------------------------------------------------------------ pulling
    def want(self) -> int:
        """Groups to pull before the next step can start (a whole cycle first in sync mode)."""
        if self.p.sync_mode and not self.buffer and self.since_sync == 0:
            return self.p.required_samples * self.trigger
        return max(0, self.p.required_samples - len(self.buffer))

    def offer(self, groups: list[Any], closed: bool) -> None:
        """Groups pulled from the queue; `closed`: the queue is closed and empty."""
        self.buffer.extend(groups)
        self.closed = self.closed or closed

    def can_step(self) -> bool:
        """A full batch is buffered, or the stream ended with a partial one (trained as a last step)."""
        return len(self.buffer) >= self.p.required_samples or (self.closed and bool(self.buffer))

    def finished(self) -> bool:
        """No step can follow: the step budget is reached, a stop was asked, or the data ran out."""
        return self.local_step >= self.p.total_local_steps or self.stopping or (self.closed and not self.buffer)

    def take_batch(self) -> tuple[list[Any], list[Any]]:
        """The next step's groups, split into (kept, dropped by the hard staleness cap)."""
        batch, self.buffer = self.buffer[: self.p.required_samples], self.buffer[self.p.required_samples:]
        if self.p.ordered:
            batch.sort(key=lambda g: (int(g.prompt.epoch), int(g.prompt.index)))
        cap = self.p.max_staleness_versions
        if cap is None or self.p.stale_policy != "drop":
            return batch, []
        keep = [g for g in batch if staleness_of(g, self.version) <= cap]
        drop = [g for g in batch if staleness_of(g, self.version) > cap]
        self.dropped_stale += len(drop)
        return keep, drop

    def put_back(self, groups: list[Any]) -> None:
        """Groups of a step that did not happen go back to the front of the buffer (for a checkpoint)."""
        self.buffer = list(groups) + self.buffer

    # ------------------------------------------------------------------ steps and syncs
    def step_done(self) -> None:
        self.local_step += 1
        self.since_sync += 1

    def sync_decision(self, outstanding_min_version: int | None) -> SyncDecision:
        """After a step: is the sync due? `outstanding_min_version`: the oldest version feeding work that
        is queued or in flight (None when there is none); the buffer is added here."""
        if self.since_sync < self.trigger:
            return SyncDecision("none")
        cap = self.p.max_staleness_versions
        if cap is not None and self.p.stale_policy == "wait" and not self.finished():
            oldest = [v for v in [outstanding_min_version, *(g.min_version for g in self.buffer)] if v is not None]
            if oldest and self.version + 1 - min(oldest) > cap:
                self.postponed = True
                return SyncDecision("postpone", max(0, self.p.required_samples - len(self.buffer)))
        self.postponed = False
        return SyncDecision("sync")

    def synced(self) -> int:
        """The weights of the next version were pushed; returns it."""
        self.version += 1
        self.since_sync = 0
        return self.version

    def checkpoint_due(self) -> bool:
        """A periodic checkpoint follows the sync that was just made."""
        every = self.p.checkpoint_every_versions
        return bool(every) and self.version % every == 0

    def can_take_trigger(self, at_sync: bool = False) -> bool:
        """Whether a new sync interval can apply now: in async mode at any local-step boundary; in sync mode
        only at a sync, before the rollouter admits the next cycle (a cycle is generated for one interval)."""
        return not self.p.sync_mode or at_sync

    def sync_owed(self) -> bool:
        """At a boundary: a lowered interval made a sync due without a step (ask `sync_decision`)."""
        return self.since_sync > 0 and self.since_sync >= self.trigger

    def set_trigger(self, trigger: int) -> bool:
        """A new sync interval, applied at this local-step boundary; True if it changed. A lowered interval
        can make a sync due at once (`sync_owed`)."""
        changed = trigger != self.trigger
        self.trigger = trigger
        return changed

    def stop(self) -> None:
        self.stopping = True

    # ------------------------------------------------------------------ checkpoint
    def state(self) -> dict[str, Any]:
        return {"version": self.version, "step": self.local_step, "since_sync": self.since_sync,
                "trigger": self.trigger, "dropped_stale": self.dropped_stale}

    def restore(self, st: dict[str, Any]) -> None:
        self.version, self.local_step, self.since_sync = int(st["version"]), int(st["step"]), int(st["since_sync"])
        self.trigger = int(st.get("trigger", self.trigger))
        self.dropped_stale = int(st.get("dropped_stale", self.dropped_stale))
