"""`TrainerLoop`: every decision of the trainer, as an events-in / commands-out core (no Ray, torch or clock).

The trainer takes one local step on `R = required_samples` prompt groups and syncs every `N =
trigger_parameter_sync_step` local steps (the parameter version counts syncs). Events are method calls
(`start`, `control`, `pulled`, `trained`, `outstanding`, `synced`, `checkpointed`, `stop`, `failed`); each
returns the commands (`engine.loop.commands`) the shell carries out. A shell executes the commands of one
answer in order; at most one of them waits for an outcome (`Pull`, `Train`, `AskOutstanding`, `Sync`,
`Checkpoint`, `PollControl`) and it is the last one: the shell reports that outcome with the matching event
and carries on with what it returns. `Finish` ends the run. The Ray actor
(`engine.runtime.trainer_actor`) and the simulator (`engine.loop.sim.world`) are both such executors.

One local step, as the core sequences it:
1. at the boundary `PollControl`: knobs (routed by `engine.loop.knobs`) and operator actions come in
   (`control`); a lowered interval can make a sync due at once; `stop` ends the run at this boundary, an
   on-demand `checkpoint` is cut here;
2. `Pull(want)` until a batch is buffered (a whole cycle `N · R` first in sync mode); `PollControl` before
   every pull, so knobs apply while the trainer waits for data; with dynamic sampling
   (`algorithm.filter_groups`) a pulled group whose responses all scored alike is dropped at once
   (`Drop(…, "filtered")`: released from the rollout budget, so another prompt is sampled in its place);
3. the hard staleness cap drops what is too old (`Drop`), the rest is trained (`Train`); `trained` counts
   the step;
4. the sync decision: not due, due (`Sync(v + 1)`; with `cut` when `v + 1` is a multiple of
   `checkpoint.every_versions`: the rollout side is snapshot while the sync has it paused, then
   `Checkpoint("periodic")`), or postponed (`stale_policy = "wait"`: `Allow(need)`); `Record` publishes the
   step's record with the interval and the staleness bound in force.
At the end (steps done, data exhausted, or stop): `Checkpoint("final" | "stop")` unless this step is saved
already, then `Finish(validate)`.

Staleness of a group trained at version `v`: `v − min_version` (the oldest weights that produced any of its
tokens). With `max_staleness_versions = c`:
- `stale_policy = "drop"`: a group with staleness > c is dropped (and released from the rollout budget);
- `stale_policy = "wait"`: the sync to `v + 1` is postponed while any outstanding group (queued, in flight,
  or in the trainer's buffer) has `v + 1 − min_version > c`; meanwhile the trainer keeps training at `v` and
  lets the rollouter admit just the prompts its next step lacks, so outstanding work drains and the sync comes.
The staleness bound reported per step: `c` when set, else ⌈staleness_threshold⌉ in force (0 in sync mode).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from engine.loop.commands import (
    AckKnob, Allow, AskOutstanding, Checkpoint, Command, Drop, Event, Finish, PollControl, Pull, Record,
    Sync, Train,
)
from engine.loop.knobs import TRAINER, KnobChange, KnobInbox, boundary


@dataclass(frozen=True)
class TrainerParams:
    """What the trainer loop needs from a run's config (built once by the run plan: `engine.plan.roles`)."""

    required_samples: int
    trigger: int
    total_local_steps: int
    sync_mode: bool = False
    max_staleness_versions: int | None = None
    stale_policy: str = "drop"
    checkpoint_every_versions: int = 0
    ordered: bool = False
    """`trainer.deterministic`: a batch's groups are ordered by prompt (epoch, index), not by arrival."""
    staleness_threshold: float = 0.0
    """In force at start (for the reported bound; the rollouter applies it)."""
    validate_at_end: bool = False
    """`trainer.test_freq > 0`: the last version is validated when the run ends (not after a stop)."""
    filter_metric: str | None = None
    """`algorithm.filter_groups.metric` when dynamic sampling is on: pulled groups whose metric does not vary
    are dropped (`Drop(…, "filtered")`) and the trainer pulls on; None = every group is trained."""


@dataclass(frozen=True)
class SyncDecision:
    """`action`: "none" (not due), "sync", or "postpone" (with `need`: prompts the next step lacks)."""

    action: str
    need: int = 0


def staleness_of(group: Any, version: int) -> int:
    """Staleness of a group trained at `version`: version − its oldest generating version."""
    return version - group.min_version


def informative(group: Any, metric: str) -> bool:
    """Whether `group` can carry a policy gradient: its responses' `metric` values are not all equal (GRPO's
    A_i = (r_i − mean r) / (std r + ε) is 0 for every response when they are), or it has one response (verl's
    `filter_groups` keeps those). `metric`: "score" (and verl's "seq_reward" / "seq_final_reward", the same
    value here) = the reward; any other name = that entry of the reward function's info."""
    if len(group.trajectories) <= 1:
        return True
    if metric in ("score", "seq_reward", "seq_final_reward"):
        values = [t.reward for t in group.trajectories]
    else:
        missing = [t for t in group.trajectories if metric not in t.reward_info]
        if missing:
            raise ValueError(f"algorithm.filter_groups.metric = {metric!r}, but the reward function returned no "
                             f"{metric!r} (it returned {sorted(missing[0].reward_info) or 'only a score'}); "
                             "use metric = \"score\" or return it")
        values = [t.reward_info[metric] for t in group.trajectories]
    return any(v != values[0] for v in values[1:])


def staleness_bound(cap: int | None, sync_mode: bool, threshold: float) -> float:
    """The hard cap when set, else verl's nominal bound ⌈staleness_threshold⌉ (0 in sync mode)."""
    if cap is not None:
        return float(cap)
    return 0.0 if sync_mode else float(math.ceil(threshold))


class TrainerLoop:
    """The trainer's core (see the module docstring). `buffer` holds pulled, untrained groups."""

    def __init__(self, params: TrainerParams) -> None:
        self.p = params
        self.trigger = params.trigger
        self.threshold = params.staleness_threshold
        self.version = 0
        self.local_step = 0
        self.since_sync = 0
        self.buffer: list[Any] = []
        self.current: list[Any] = []  # the groups of the step being trained
        self.closed = False
        self.stopping = False
        self.postponed = False
        self.dropped_stale = 0
        self.filtered_groups = 0
        self.last_checkpoint_step: int | None = None
        self.last_decision: SyncDecision | None = None
        self.done = False
        self._held_trigger: tuple[int, int] | None = None  # (value, knob version): sync mode, taken at the sync
        self._sync: tuple[int, bool, bool] | None = None  # (version, cut, after a step) of the sync out
        self._then: str = "boundary"  # what follows the Checkpoint out: "boundary" or "finish"
        self._owed_record = False
        self._recheck = True  # False from a postponed sync until the next pull's outcome (no loop at one instant)

    # ------------------------------------------------------------------ queries
    def want(self) -> int:
        """Groups to pull before the next step can start (a whole cycle first in sync mode)."""
        if self.p.sync_mode and not self.buffer and self.since_sync == 0:
            return self.p.required_samples * self.trigger
        return max(0, self.p.required_samples - len(self.buffer))

    def can_step(self) -> bool:
        """A full batch is buffered, or the stream ended with a partial one (trained as a last step)."""
        return len(self.buffer) >= self.p.required_samples or (self.closed and bool(self.buffer))

    def finished(self) -> bool:
        """No step can follow: the step budget is reached, a stop was asked, or the data ran out."""
        return self.local_step >= self.p.total_local_steps or self.stopping or (self.closed and not self.buffer)

    def due(self) -> bool:
        """The sync cadence: a sync is due once the steps since the last one reach the interval in force."""
        return self.since_sync >= self.trigger

    def sync_owed(self) -> bool:
        """At a boundary: a lowered interval made a sync due without a step."""
        return self.since_sync > 0 and self.due()

    def staleness_bound(self) -> float:
        return staleness_bound(self.p.max_staleness_versions, self.p.sync_mode, self.threshold)

    def _wait_policy(self) -> bool:
        return self.p.max_staleness_versions is not None and self.p.stale_policy == "wait"

    @property
    def next_trigger(self) -> int:
        """The sync interval in force once the sync under way is done (sync mode: a held change takes it)."""
        return self._held_trigger[0] if self._held_trigger else self.trigger

    def inbox(self) -> KnobInbox:
        """The shell's view of the knob table for this core (`engine.loop.knobs`)."""
        return KnobInbox(TRAINER, self.p.sync_mode)

    # ------------------------------------------------------------------ events
    def start(self) -> list[Command]:
        """The run (or a resumed run) begins at a local-step boundary."""
        return self._boundary()

    def stop(self) -> list[Command]:
        """A graceful stop: the run ends at the next boundary with a stop checkpoint (nothing to do now)."""
        self.stopping = True
        return []

    def control(self, knobs: list[KnobChange], actions: list[str]) -> list[Command]:
        """`PollControl`'s outcome: knob changes routed to the trainer and the operator's actions."""
        cmds: list[Command] = []
        for k in knobs:
            cmds += self._knob(k)
        for a in actions:
            if a == "stop":
                self.stopping = True
        if "checkpoint" in actions:
            self._then = "boundary_no_poll"
            return cmds + [Checkpoint("on_demand")]
        return cmds + self._after_control()

    def pulled(self, groups: list[Any], closed: bool) -> list[Command]:
        """`Pull`'s outcome; `closed`: the queue is closed and empty. With dynamic sampling the groups that
        carry no gradient are dropped here, so the buffer fills with informative ones only."""
        cmds: list[Command] = []
        if self.p.filter_metric is not None:
            keep = [informative(g, self.p.filter_metric) for g in groups]
            flat = tuple(g for g, k in zip(groups, keep) if not k)
            if flat:
                self.filtered_groups += len(flat)
                cmds.append(Drop(flat, "filtered"))
                groups = [g for g, k in zip(groups, keep) if k]
        self.buffer.extend(groups)
        self.closed = self.closed or closed
        self._recheck = True
        if not self.can_step():
            return cmds + self._boundary()
        return cmds + self._take()

    def trained(self) -> list[Command]:
        """`Train`'s outcome: the optimizer step is done (the shell has it in the ledger)."""
        self.current = []
        self.local_step += 1
        self.since_sync += 1
        return self._sync_point(after_step=True)

    def outstanding(self, min_version: int | None) -> list[Command]:
        """`AskOutstanding`'s outcome: the oldest version feeding queued or in-flight work (None: none)."""
        return self._decide(min_version, self._owed_record)

    def synced(self) -> list[Command]:
        """`Sync`'s outcome: the weights of the next version are on the replicas."""
        assert self._sync is not None
        version, cut, after_step = self._sync
        self._sync = None
        self.version = version
        self.since_sync = 0
        cmds: list[Command] = []
        if self._held_trigger is not None:  # sync mode: the interval acknowledged with the `Sync` is in force now
            self.trigger, self._held_trigger = self._held_trigger[0], None
        if after_step:
            cmds.append(self._record("sync"))
        if cut:
            self._then = "boundary"
            return cmds + [Checkpoint("periodic")]
        return cmds + self._boundary()

    def checkpointed(self) -> list[Command]:
        """`Checkpoint`'s outcome (written, or failed and reported by the shell)."""
        self.last_checkpoint_step = self.local_step
        then, self._then = self._then, "boundary"
        if then == "finish":
            self.done = True
            return [Finish(validate=self.p.validate_at_end and not self.stopping)]
        if then == "boundary_no_poll":
            return self._after_control()
        return self._boundary()

    def failed(self, weights_dirty: bool) -> list[Command]:
        """A step raised. Before the optimizer changed the weights its groups go back to the buffer and a
        checkpoint is cut; after, nothing consistent can be saved (the step is not in the ledger)."""
        self.done = True
        self._then = "boundary"
        if weights_dirty:
            return [Event("error", "checkpoint", "no checkpoint at the failure: it happened during an optimizer "
                          "step; resume from the previous checkpoint")]
        self.buffer = list(self.current) + self.buffer
        self.current = []
        return [Checkpoint("failure")]

    # ------------------------------------------------------------------ the sequence
    def _boundary(self) -> list[Command]:
        if self.done:
            return []
        return [PollControl()]

    def _after_control(self) -> list[Command]:
        if self.sync_owed() and not self.finished() and self._recheck:
            return self._sync_point(after_step=False)
        if self.finished():
            return self._finish()
        if self.can_step():  # a resumed buffer can hold a whole batch
            return self._take()
        return [Pull(self.want())]

    def _take(self) -> list[Command]:
        batch, self.buffer = self.buffer[: self.p.required_samples], self.buffer[self.p.required_samples:]
        if self.p.ordered:
            batch.sort(key=lambda g: (int(g.prompt.epoch), int(g.prompt.index)))
        cap = self.p.max_staleness_versions
        keep, drop = batch, []
        if cap is not None and self.p.stale_policy == "drop":
            keep = [g for g in batch if staleness_of(g, self.version) <= cap]
            drop = [g for g in batch if staleness_of(g, self.version) > cap]
        cmds: list[Command] = []
        if drop:
            self.dropped_stale += len(drop)
            cmds.append(Drop(tuple(drop), "stale"))
        if not keep:
            return cmds + self._boundary()
        self.current = keep
        return cmds + [Train(tuple(keep))]

    def _sync_point(self, after_step: bool) -> list[Command]:
        if not self.due():
            self.last_decision = SyncDecision("none")
            return [self._record("none")] + self._boundary() if after_step else self._boundary()
        if self._wait_policy() and not self.finished():
            self._owed_record = after_step
            return [AskOutstanding()]
        return self._decide(None, after_step)

    def sync_decision(self, outstanding_min_version: int | None) -> SyncDecision:
        """After a step: is the sync due? `outstanding_min_version`: the oldest version feeding work that
        is queued or in flight (None when there is none); the buffer is added here."""
        if not self.due():
            return SyncDecision("none")
        cap = self.p.max_staleness_versions
        if cap is not None and self.p.stale_policy == "wait" and not self.finished():
            oldest = [v for v in [outstanding_min_version, *(g.min_version for g in self.buffer)] if v is not None]
            if oldest and self.version + 1 - min(oldest) > cap:
                return SyncDecision("postpone", max(0, self.p.required_samples - len(self.buffer)))
        return SyncDecision("sync")

    def _decide(self, outstanding: int | None, after_step: bool) -> list[Command]:
        d = self.last_decision = self.sync_decision(outstanding)
        if d.action == "sync":
            self.postponed = False
            version = self.version + 1
            every = self.p.checkpoint_every_versions
            cut = bool(every) and version % every == 0
            self._sync = (version, cut, after_step)
            # sync mode: a held interval is acknowledged before the weights go out, so the rollouter (which follows
            # the applied value, `engine.loop.knobs`) takes it at this sync, as the trainer does
            ack = [AckKnob("trigger_parameter_sync_step", self._held_trigger[1])] if self._held_trigger else []
            return [*ack, Sync(version, cut, len(self.buffer))]
        cmds: list[Command] = []
        if d.action == "postpone":
            if not self.postponed:
                cmds.append(Event("info", "sync", "sync postponed: outstanding work would exceed "
                                  "max_staleness_versions; admitting only what the next step lacks"))
            self.postponed = True
            self._recheck = False
            cmds.append(Allow(d.need))
        if after_step:
            cmds.append(self._record(d.action))
        return cmds + self._boundary()

    def _record(self, decision: str) -> Record:
        return Record(self.local_step, self.version, self.trigger, self.staleness_bound(), decision)

    def _finish(self) -> list[Command]:
        self._then = "finish"
        if self.last_checkpoint_step == self.local_step:
            return self.checkpointed()  # this step is saved already
        return [Checkpoint("stop" if self.stopping else "final")]

    def _knob(self, k: KnobChange) -> list[Command]:
        if k.name == "staleness_threshold" and not k.owned:
            self.threshold = float(k.value)
            return []
        if k.name != "trigger_parameter_sync_step" or not k.owned:
            return []
        if k.refused:
            return [Event("warning", "knob", f"{k.name} = {k.value!r} refused: {k.refused}", {"knob": k.name})]
        if boundary(k.name, self.p.sync_mode) == "sync":
            self._held_trigger = (int(k.value), k.version)
            return []
        self.trigger = int(k.value)  # the rollouter follows once acknowledged (its inbox), as this core follows staleness
        return [AckKnob(k.name, k.version)]

    # ------------------------------------------------------------------ checkpoint
    def state(self) -> dict[str, Any]:
        return {"version": self.version, "step": self.local_step, "since_sync": self.since_sync,
                "trigger": self.trigger, "dropped_stale": self.dropped_stale,
                "filtered_groups": self.filtered_groups, "staleness_threshold": self.threshold}

    def restore(self, st: dict[str, Any]) -> None:
        self.version, self.local_step, self.since_sync = int(st["version"]), int(st["step"]), int(st["since_sync"])
        self.trigger = int(st.get("trigger", self.trigger))
        self.dropped_stale = int(st.get("dropped_stale", self.dropped_stale))
        self.filtered_groups = int(st.get("filtered_groups", self.filtered_groups))
        self.threshold = float(st.get("staleness_threshold", self.threshold))
        self.last_checkpoint_step = self.local_step
