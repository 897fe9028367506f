"""The knob router: which knob change reaches which loop core, from the knob table (`engine.control.knob_table`).

Every shell (the Ray actors and the simulator) reads the controller's knob table (`get_knobs()`: per knob the
desired `value`/`version` and the `applied_value`/`applied_version` its owner acknowledged) and passes it to its
`KnobInbox`, which returns the changes routed to its core, each once, by the table's `owner` and `followers`. The
owner gets each desired version once (a fresh inbox, as a restarted core's, gets every value set since the run
began, so the values in force survive the restart; applying one twice is harmless); a follower gets the value once
the owner applied it (applied version newer than what it has seen), so what it uses is the value in force — one
path for every knob, no side channel: the trainer follows `staleness_threshold`, the rollouter follows
`trigger_parameter_sync_step`. A refused change (`refusal`: the knob's `sync_refusal` in sync mode) comes back with
its reason; the owner's shell records it as a warning event and does not acknowledge it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.control.knob_table import KNOBS, ROLLOUTER, TRAINER, boundary, refusal

__all__ = ["KNOBS", "ROLLOUTER", "TRAINER", "KnobChange", "KnobInbox", "boundary", "refusal"]


@dataclass(frozen=True)
class KnobChange:
    """A knob change for one core: `owned` changes are applied and acknowledged (`version`) by it, the
    others are the value in force that it follows. `refused`: why it cannot apply (owned changes only)."""

    name: str
    value: Any
    version: int
    owned: bool
    refused: str | None = None


class KnobInbox:
    """One core's view of the controller's knob table (see the module docstring)."""

    def __init__(self, core: str, sync_mode: bool = False) -> None:
        self.core = core
        self.sync_mode = sync_mode
        self.seen: dict[str, int] = {}

    def take(self, knobs: dict[str, dict[str, Any]]) -> list[KnobChange]:
        """The changes routed to this core that it has not seen yet, from `get_knobs()`'s table."""
        out: list[KnobChange] = []
        for name, view in knobs.items():
            knob = KNOBS.get(name)
            if knob is None:
                continue
            if knob.owner == self.core:
                version, value = int(view["version"]), view["value"]
                if version <= self.seen.get(name, 0):
                    continue
                out.append(KnobChange(name, value, version, True, refusal(name, self.sync_mode)))
            elif self.core in knob.followers:
                version, value = int(view.get("applied_version", 0)), view.get("applied_value")
                if version <= self.seen.get(name, 0):
                    continue
                out.append(KnobChange(name, value, version, False))
            else:
                continue
            self.seen[name] = version
        return out
