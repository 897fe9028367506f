"""The one-line run header: run, address, state, policy version, step of total, validation accuracy (once a
validation ran: `val 0.750 mean@4`), elapsed, ETA."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from asyncrl_cli.tui.format import MISSING, fmt_duration
from asyncrl_cli.tui.model import DashboardModel

STATE_STYLES = {
    "running": "bold green",
    "paused": "bold yellow",
    "finished": "bold cyan",
    "failed": "bold red",
    "stopped": "bold magenta",
    "disconnected": "bold white on red",
    "connecting": "dim",
}


def header_text(model: DashboardModel, label: str, read_only: bool) -> Text:
    """`RUN  STATE  [read-only] · policy vN · step S/T [· val A mean@n] · elapsed E · ETA R · ADDRESS`
    (important first)."""
    state = model.state if model.connected else "disconnected"
    version = model.policy_version
    step, total = model.step, model.total_steps
    eta = "done" if state == "finished" else fmt_duration(model.eta)
    parts: list[str | tuple[str, str]] = [
        (str(model.run.get("name") or MISSING), "bold"),
        " ",
        (f" {state.upper()} ", STATE_STYLES.get(state, "bold")),
    ]
    if read_only:
        parts.append((" read-only", "bold yellow"))
    parts += [
        f" · policy v{version if version is not None else MISSING}",
        f" · step {step if step is not None else MISSING}/{total if total is not None else MISSING}",
    ]
    val = model.validation()
    if val is not None:
        parts.append(f" · val {val[0]:.3f} mean@{val[1]}")
    parts.append(f" · elapsed {fmt_duration(model.elapsed)} · ETA {eta} · {label}")
    return Text.assemble(*parts)


class RunHeader(Static):
    """Header line, refreshed on every snapshot."""

    DEFAULT_CSS = """
    RunHeader {
        height: 1;
        padding: 0 1;
        background: $panel;
    }
    """

    def show(self, model: DashboardModel, label: str, read_only: bool) -> None:
        text = header_text(model, label, read_only)
        if str(self.content) != str(text):
            self.update(text, layout=False)
