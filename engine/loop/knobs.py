"""The knob router: which live knob reaches which loop core, at which boundary, and what is refused.

Every shell (the Ray actors and the simulator) reads the controller's knob table (`get_knobs()`: per knob
the desired `value`/`version` and the `applied_value`/`applied_version` its owner acknowledged) and passes
it to its `KnobInbox`, which returns the changes routed to its core, each once:

| knob                          | owner (applies, acks)                           | follower (reads the value in force) |
|-------------------------------|-------------------------------------------------|-------------------------------------|
| `trigger_parameter_sync_step` | trainer: at its next local-step boundary; in sync mode at its next sync (a cycle is generated for one interval); it forwards the value to the rollouter's budget in the same breath | — |
| `staleness_threshold`         | rollouter: at once, in the staleness budget; refused in sync mode (the budget is 0 there) | trainer: the `asyncrl/staleness/bound` it reports |
| `paused`                      | rollouter: at once                                | — |

The owner gets each desired version once (a fresh inbox, as a restarted core's, gets every value set since
the run began, so the values in force survive the restart; applying one twice is harmless); a follower gets
the value once the owner applied it (applied version newer than what it has seen), so what it reports is
the value in force. A refused change comes back with its reason; the owner's shell
records it as a warning event and does not acknowledge it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

TRAINER = "trainer"
ROLLOUTER = "rollouter"


@dataclass(frozen=True)
class Route:
    owner: str
    followers: tuple[str, ...] = ()
    boundary: str = "now"
    """"now" (at once), "step" (the trainer's next local-step boundary) or "sync" (its next sync)."""


ROUTES: dict[str, Route] = {
    "trigger_parameter_sync_step": Route(TRAINER, boundary="step"),
    "staleness_threshold": Route(ROLLOUTER, followers=(TRAINER,)),
    "paused": Route(ROLLOUTER),
}


def boundary(name: str, sync_mode: bool) -> str:
    """When the owner applies `name`: the sync interval waits for the next sync in sync mode."""
    b = ROUTES[name].boundary
    return "sync" if b == "step" and sync_mode else b


def refusal(name: str, sync_mode: bool) -> str | None:
    """Why a live change of `name` cannot apply in this run (None: it can)."""
    if name not in ROUTES:
        return f"no loop core takes knob {name!r}"
    if name == "staleness_threshold" and sync_mode:
        return 'async_training.mode = "sync" keeps the staleness budget at 0; staleness_threshold has no effect'
    return None


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
            route = ROUTES.get(name)
            if route is None:
                continue
            if route.owner == self.core:
                version, value = int(view["version"]), view["value"]
                if version <= self.seen.get(name, 0):
                    continue
                out.append(KnobChange(name, value, version, True, refusal(name, self.sync_mode)))
            elif self.core in route.followers:
                version, value = int(view.get("applied_version", 0)), view.get("applied_value")
                if version <= self.seen.get(name, 0):
                    continue
                out.append(KnobChange(name, value, version, False))
            else:
                continue
            self.seen[name] = version
        return out
