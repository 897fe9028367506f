"""The live knobs of `RolloutLoop` (a mixin of it): the ones it owns, applied at once and acknowledged, and the
sync interval it follows.

Routed by `engine.loop.knobs` (`KnobInbox(ROLLOUTER)`):
- `staleness_threshold` (owned): the budget's `s` from now on (refused in sync mode, where it stays 0);
- `paused` (owned): no new group is admitted while true;
- `trigger_parameter_sync_step` (followed): the trainer applied a new `N`; the budget
  `max_required_samples = ⌊R·(1+s)·N⌋` uses it at once — in sync mode at the next `finish_sync`, where the
  trainer takes it too (it acknowledges the change just before that sync's weights go out), so one cycle is
  generated for one interval.
"""

from __future__ import annotations

from engine.loop.commands import AckKnob, Command, Event
from engine.loop.knobs import ROLLOUTER, KnobChange, KnobInbox


class RolloutKnobs:
    """`knob`, `inbox` and the knob setters of `RolloutLoop`."""

    held_trigger: int | None = None
    """Sync mode: the followed interval waiting for the next `finish_sync`."""

    def set_trigger(self, trigger: int) -> list[Command]:
        """A new sync interval in force: the budget uses it now."""
        self.budget.set_knobs(trigger=trigger)
        return self._bound_changed()

    def set_staleness(self, value: float) -> list[Command]:
        """A new staleness_threshold, in force now (ignored in sync mode, where it is 0)."""
        if self.p.sync_mode:
            return []
        self.budget.set_knobs(staleness_threshold=value)
        return self._bound_changed()

    def set_paused(self, paused: bool) -> None:
        self.paused = paused

    def inbox(self) -> KnobInbox:
        """The shell's view of the knob table for this core (`engine.loop.knobs`)."""
        return KnobInbox(ROLLOUTER, self.p.sync_mode)

    def knob(self, k: KnobChange) -> list[Command]:
        """A knob change routed to the rollouter (`engine.loop.knobs`): an owned one applied at once and
        acknowledged, or refused with its reason; a followed one taken as the value in force."""
        if not k.owned:
            if k.name != "trigger_parameter_sync_step":
                return []
            if self.p.sync_mode:
                self.held_trigger = int(k.value)
                return []
            return self.set_trigger(int(k.value))
        if k.refused:
            return [Event("warning", "knob", f"{k.name} = {k.value!r} refused: {k.refused}", {"knob": k.name})]
        if k.name == "staleness_threshold":
            cmds = self.set_staleness(float(k.value))
        elif k.name == "paused":
            self.set_paused(bool(k.value))
            cmds = []
        else:
            return []
        return cmds + [AckKnob(k.name, k.version)]

    def take_held_trigger(self) -> None:
        """At `finish_sync`, before the budget restarts: a held interval is in force from this version on."""
        if self.held_trigger is not None:
            self.budget.set_knobs(trigger=self.held_trigger)
            self.held_trigger = None
