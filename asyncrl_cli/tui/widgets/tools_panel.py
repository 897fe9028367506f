"""The tools tab of a multi-turn run: a summary tile and two charts (calls and turns per trajectory; call latency).

The tile, from the latest step's record: calls per trajectory, turns per trajectory (verl's `num_turns/mean`),
the share of the step's calls that ended `error` / `timeout` / `limit` / `refused` (`asyncrl/tools/status/*` ÷
`asyncrl/tools/calls`), latency p50 / p99, the calls waiting now against `max_concurrent_tools` (from the run's
config) and, with stateful verl-style class tools, their live instances (one box per trajectory). Any refused call turns the tile red (the sandbox could not run it), a timeout or limit share above 10 %
yellow.
"""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from asyncrl_cli.tui import model as m
from asyncrl_cli.tui.format import MISSING, fmt_num, fmt_pct, is_number
from asyncrl_cli.tui.widgets.time_chart import Line, TimeChart

CALLS = "asyncrl/tools/calls"
PER_TRAJ = "asyncrl/tools/calls_per_trajectory"
TURNS = "num_turns/mean"
WAITING = "asyncrl/tools/waiting"
INSTANCES = "asyncrl/tools/instances"
P50, P99 = "asyncrl/tools/latency_s/p50", "asyncrl/tools/latency_s/p99"
FAILURES = ("error", "timeout", "limit", "refused")
WARN_SHARE = 0.10


def is_multi_turn(model: m.DashboardModel) -> bool:
    """A run with tools: its config turns multi-turn on, or tool metrics arrive."""
    mt = ((model.run.get("config") or {}).get("rollout") or {}).get("multi_turn") or {}
    return bool(mt.get("enable")) or model.latest(CALLS) is not None


def tools_summary(model: m.DashboardModel) -> tuple[str, str]:
    """The tile's text and level (`""`, `warn`, `alert`)."""
    mt = ((model.run.get("config") or {}).get("rollout") or {}).get("multi_turn") or {}
    calls = model.latest(CALLS)
    shares: dict[str, Any] = {}
    for status in FAILURES:
        n = model.latest(f"asyncrl/tools/status/{status}")
        shares[status] = n / calls if is_number(n) and is_number(calls) and calls > 0 else None
    lines = [
        f"calls / trajectory  {fmt_num(model.latest(PER_TRAJ), 3)}     turns / trajectory  "
        f"{fmt_num(model.latest(TURNS), 3)}     calls this step  {fmt_num(calls)}",
        "   ".join(f"{s} {fmt_pct(v)}" for s, v in shares.items()),
        f"latency p50 {fmt_num(model.latest(P50), 3)} s   p99 {fmt_num(model.latest(P99), 3)} s     waiting "
        f"{fmt_num(model.latest(WAITING))} / {fmt_num(mt.get('max_concurrent_tools', MISSING))} slots"
        + (f"     instances {fmt_num(model.latest(INSTANCES))}" if model.latest(INSTANCES) else ""),
    ]
    level = ""
    if any(is_number(shares[s]) and shares[s] > WARN_SHARE for s in ("timeout", "limit")):
        level = "warn"
    if is_number(shares["refused"]) and shares["refused"] > 0:
        level = "alert"
    return "\n".join(lines), level


class ToolsPanel(Vertical):
    """The summary tile above the two charts."""

    DEFAULT_CSS = """
    ToolsPanel { height: 1fr; }
    ToolsPanel #tools-summary { height: 5; border: round $primary; padding: 0 1; }
    ToolsPanel #tools-summary.-warn { border: round $warning; }
    ToolsPanel #tools-summary.-alert { border: round $error; }
    ToolsPanel TimeChart { height: 1fr; }
    """

    def compose(self) -> ComposeResult:
        tile = Static(MISSING, id="tools-summary")
        tile.border_title = "tools"
        yield tile
        yield TimeChart("per trajectory", [Line(PER_TRAJ, "calls", "cyan"), Line(TURNS, "turns", "magenta")],
                        id="chart-tools-calls")
        yield TimeChart("tool call latency (s)", [Line(P50, "p50", "green"), Line(P99, "p99", "red")],
                        id="chart-tools-latency")

    def show(self, model: m.DashboardModel) -> None:
        text, level = tools_summary(model)
        tile = self.query_one("#tools-summary", Static)
        tile.update(text)
        tile.set_class(level == "warn", "-warn")
        tile.set_class(level == "alert", "-alert")
