"""Workers table: rollout replicas and trainer ranks (state, tokens/s, weight version, lag, last seen).

Rows are updated in place (keyed by worker id). A worker not heard from for `stale_after_s` is shown as
STALE, as vllm-htop does, instead of silently keeping its last state.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widgets import DataTable

from asyncrl_cli.tui.format import MISSING, fmt_duration, fmt_num, fmt_rate, is_number

COLUMNS = ("worker", "role", "state", "tok/s", "weights", "lag", "seen")
STATE_STYLE = {
    "running": "green",
    "busy": "green",
    "idle": "dim",
    "syncing": "cyan",
    "paused": "yellow",
    "finished": "cyan",
    "failed": "red",
    "dead": "red",
    "restarting": "yellow",
    "STALE": "magenta",
}
LIVE_STATES = ("running", "busy", "idle", "syncing", "paused")


def worker_cells(row: dict[str, Any], now: float | None, stale_after_s: float) -> list[Text | str]:
    """The display cells of one (normalized) worker row; silent live workers show as STALE."""
    state = str(row.get("state") or MISSING)
    seen = row.get("last_seen")
    age = (now - seen) if is_number(now) and is_number(seen) else None
    if age is not None and age > stale_after_s and state in LIVE_STATES:
        state = "STALE"
    version = row.get("weight_version")
    return [
        Text(str(row.get("id"))),
        Text(str(row.get("role") or MISSING)),
        Text(state, style=STATE_STYLE.get(state, "")),
        fmt_rate(row.get("tokens_per_s")),
        f"v{version}" if version is not None else MISSING,
        fmt_num(row.get("lag")),
        f"{fmt_duration(age)} ago" if age is not None else MISSING,
    ]


class WorkersTable(DataTable):
    """One row per worker, trainer first."""

    def __init__(self, *, stale_after_s: float = 30.0, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=True)
        self.stale_after_s = stale_after_s

    def on_mount(self) -> None:
        for column in COLUMNS:
            self.add_column(column, key=column)

    def show(self, order: list[dict[str, Any]], now: float | None) -> None:
        """Show `DashboardModel.worker_rows()` (normalized, trainer first)."""
        wanted = {str(r.get("id")) for r in order}
        for key in [k.value for k in self.rows if k.value not in wanted]:
            self.remove_row(key)
        for row in order:
            wid = str(row.get("id"))
            cells = worker_cells(row, now, self.stale_after_s)
            if wid in {k.value for k in self.rows}:
                for column, cell in zip(COLUMNS, cells, strict=True):
                    self.update_cell(wid, column, cell)
            else:
                self.add_row(*cells, key=wid)
