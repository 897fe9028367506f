"""Command palette provider: the dashboard's actions (one per knob of the table), without the mutating ones in
read-only mode."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

from textual.command import DiscoveryHit, Hit, Hits, Provider

from engine.control.knob_table import KNOBS

if TYPE_CHECKING:
    from asyncrl_cli.tui.app import DashboardApp

TABS = (
    ("overview", "Overview"),
    ("distributions", "Distributions"),
    ("workers", "Workers"),
    ("events", "Events"),
    ("config", "Config"),
)


def palette_commands(app: DashboardApp) -> list[tuple[str, str, Callable[[], object]]]:
    """`(name, help, callback)` for every command that makes sense for this session."""
    commands: list[tuple[str, str, Callable[[], object]]] = []
    if not app.read_only:
        for knob in KNOBS.values():  # every knob of the table: a bool toggles, a number opens its input
            if knob.kind is bool:
                now = bool(app.model.knob(knob.name).get("value"))
                name = knob.verb(not now)
            else:
                name = f"Set {knob.label().lower()}…"
            commands.append((name, f"{knob.name}: applies {knob.applies}", partial(app.action_knob, knob.name)))
        commands += [
            ("Checkpoint now", "taken at the trainer's next local step", app.action_checkpoint),
            ("Stop the run gracefully…", "checkpoint and finish at the next local step", app.action_stop_run),
        ]
    commands += [
        (f"Show {label}", f"switch to the {label.lower()} tab", partial(app.action_show_tab, tab))
        for tab, label in TABS
    ]
    commands += [
        ("Poll now", "refresh the data immediately", app.action_refresh),
        ("Help", "keys and knobs", app.action_help),
        ("Detach", "leave the dashboard; the run goes on", app.action_detach),
    ]
    return commands


class DashboardCommands(Provider):
    """Offers `palette_commands(app)`; fuzzy-matched on the name."""

    def _app(self) -> DashboardApp:
        return self.app  # type: ignore[return-value]

    async def discover(self) -> Hits:
        for name, help_text, callback in palette_commands(self._app()):
            yield DiscoveryHit(name, callback, help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for name, help_text, callback in palette_commands(self._app()):
            score = matcher.match(name)
            if score > 0:
                yield Hit(score, matcher.highlight(name), callback, text=name, help=help_text)
