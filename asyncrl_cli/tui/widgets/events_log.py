"""The events log: one line per event, warnings and errors highlighted, knob changes marked."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widgets import RichLog

from asyncrl_cli.tui.format import fmt_clock

LEVEL_STYLE = {"warning": "bold yellow", "error": "bold white on red"}
KIND_STYLE = {
    "knob": "bold cyan",
    "sync": "green",
    "checkpoint": "blue",
    "finish": "bold cyan",
    "start": "bold cyan",
    "drop": "yellow",
    "replica": "magenta",
    "validation": "green",
}


def event_line(event: dict[str, Any], compact: bool = False) -> Text:
    """`HH:MM:SS  step  KIND      message` (compact: `step kind message`), styled by level or kind."""
    level = str(event.get("level", "info"))
    kind = str(event.get("kind", "event"))
    step = event.get("step")
    style = LEVEL_STYLE.get(level, "")
    head: list[str | tuple[str, str]] = [] if compact else [(fmt_clock(event.get("time")), "dim"), "  "]
    return Text.assemble(
        *head,
        f"{'' if step is None else step:>{3 if compact else 5}} ",
        (
            f"{kind:<{6 if compact else 10}}" if not compact else kind[:5].ljust(5),
            style or KIND_STYLE.get(kind, ""),
        ),
        " ",
        (str(event.get("message", "")), style),
    )


class EventsLog(RichLog):
    """Appends new events; `warnings` counts the warning/error lines shown (for tests and the tab title)."""

    def __init__(self, *, id: str | None = None, max_lines: int = 2000, compact: bool = False) -> None:
        super().__init__(
            id=id,
            max_lines=max_lines,
            wrap=compact,
            markup=False,
            highlight=False,
            auto_scroll=True,
            min_width=20 if compact else 78,
        )
        self.compact = compact
        self.warnings = 0
        self.count = 0

    def add_events(self, events: list[dict[str, Any]]) -> None:
        for event in events:
            self.write(event_line(event, self.compact))
            self.count += 1
            if event.get("level") in LEVEL_STYLE:
                self.warnings += 1
