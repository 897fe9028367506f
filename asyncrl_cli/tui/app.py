"""`DashboardApp`: the `asyncrl attach` Textual app over any `MetricsSource`.

Data path: a thread worker calls `source.snapshot(cursor)` every `poll_interval` seconds, merges the delta
into a `SnapshotBuffer` and posts one replaceable `SnapshotReady`; the UI drains the buffer, folds it
into the `DashboardModel` and redraws. A raising source shows the disconnect banner; the next good poll
clears it. Mutations (knobs, pause, checkpoint, stop) go through an input/confirmation modal and run in a
thread worker; in read-only mode they are neither bound nor executed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingsMap
from textual.containers import Grid, Horizontal
from textual.widgets import Footer, TabbedContent, TabPane

from asyncrl_cli.tui import model as m
from asyncrl_cli.tui.commands import DashboardCommands
from asyncrl_cli.tui.knob_change import describe_knob_change
from asyncrl_cli.tui.messages import SnapshotReady, SourceFailed
from asyncrl_cli.tui.poller import SnapshotBuffer, next_cursor
from asyncrl_cli.tui.screens.confirm import ConfirmScreen
from asyncrl_cli.tui.screens.help import HelpScreen
from asyncrl_cli.tui.screens.knob_input import KnobInputScreen
from asyncrl_cli.tui.widgets.banner import DisconnectBanner
from asyncrl_cli.tui.widgets.config_view import ConfigView
from asyncrl_cli.tui.widgets.events_log import EventsLog
from asyncrl_cli.tui.widgets.histogram_chart import HistogramChart
from asyncrl_cli.tui.widgets.kpi_row import KpiRow
from asyncrl_cli.tui.widgets.run_header import RunHeader
from asyncrl_cli.tui.widgets.sync_chart import SyncChart
from asyncrl_cli.tui.widgets.time_chart import Line, TimeChart
from asyncrl_cli.tui.widgets.tools_panel import ToolsPanel, is_multi_turn
from asyncrl_cli.tui.widgets.workers_table import WorkersTable
from engine.control.knob_table import KNOBS

if TYPE_CHECKING:  # the dashboard reads any source; the control client loads only in the command that opens one
    from engine.control.client import MetricsSource

OVERVIEW_CHARTS = (  # (widget id, title, [(metric, label, colour), ...]) of the overview's time charts
    ("chart-throughput", "throughput (tok/s)",
     [(m.TRAINER_TPS, "trainer", "cyan"), (m.ROLLOUT_TPS, "rollout", "magenta")]),
    ("chart-staleness", "staleness (versions)",
     [(m.STALE_MEAN, "mean", "green"), (m.STALE_MAX, "max", "orange"), (m.STALE_BOUND, "bound", "red")]),
    ("chart-is", "IS ratio π_train/π_rollout",
     [(m.IS_MEAN, "mean", "green"), (m.IS_MIN, "min", "blue"), (m.IS_MAX, "max", "red")]),
    ("chart-reward", "reward", [(m.REWARD, "reward", "green"), (m.SCORE, "score", "cyan")]),
)
MUTATING_ACTIONS = frozenset({"knob", "checkpoint", "stop_run"})
READ_ONLY_REFUSAL = "read-only session: changes are disabled"


def knob_bindings() -> list[Binding]:
    """One key per knob of the table that has one (`engine.control.knob_table.Knob.key`): `knob('NAME')`."""
    return [Binding(k.key, f"knob({k.name!r})", k.key_label or k.name, id=f"knob-{k.name}")
            for k in KNOBS.values() if k.key]


def with_knob_keys(merged: BindingsMap) -> BindingsMap:
    """The app's bindings with the knob keys in front of the checkpoint key (the footer's order: knobs,
    checkpoint, help, detach), built when the app is — so a knob added to the table gets its key."""
    out, pending = BindingsMap(), knob_bindings()
    for key, bindings in merged.key_to_bindings.items():
        if pending and any(b.id == "checkpoint" for b in bindings):
            for b in pending:
                out.key_to_bindings.setdefault(b.key, []).append(b)
            pending = []
        out.key_to_bindings.setdefault(key, []).extend(bindings)
    return out


def one_line(err: BaseException) -> str:
    """The first line of an exception's message (its type name when empty)."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


class DashboardApp(App[int]):
    """Live (or replayed) view of one run; `q` detaches and never stops the run."""

    CSS_PATH = "app.tcss"
    TITLE = "asyncrl"
    COMMANDS = App.COMMANDS | {DashboardCommands}
    BINDINGS = [
        # the knobs' keys come from the knob table and go in front of these (`knob_bindings`)
        Binding("c", "checkpoint", "Checkpoint", id="checkpoint"),
        Binding("question_mark", "help", "Help", id="help"),
        Binding("q", "detach", "Detach", id="detach"),
        Binding("ctrl+r", "refresh", "Poll now", show=False, id="refresh"),
        *(
            Binding(str(i), f"show_tab('{tab}')", tab.title(), show=False, id=f"tab-{tab}")
            for i, tab in enumerate(("overview", "distributions", "workers", "events", "config"), start=1)
        ),
    ]

    def __init__(
        self,
        source: MetricsSource,
        *,
        read_only: bool = False,
        poll_interval: float = 1.0,
        history: int = 400,
    ) -> None:
        super().__init__()
        self._bindings = with_knob_keys(self._bindings)
        self.source = source
        self.read_only = bool(read_only or getattr(source, "read_only", False))
        self.poll_interval = poll_interval
        self.model = m.DashboardModel(history=history)
        self.buffer = SnapshotBuffer()
        self.last_result: dict[str, Any] | None = None
        self.polls = 0
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._last_data_at: float | None = None
        self._dirty_charts: set[Any] = set()
        self.chart_interval = 2 * poll_interval
        self._last_chart_draw = -float("inf")
        self._chart_timer: Any = None
        self.tools_panel: ToolsPanel | None = None

    # ------------------------------------------------------------------------------------ layout

    def compose(self) -> ComposeResult:
        yield RunHeader(id="header")
        yield DisconnectBanner(id="banner")
        yield KpiRow(id="kpis")
        with TabbedContent(initial="overview", id="tabs"):
            with TabPane("1 Overview", id="overview"), Grid(id="charts"):
                for chart_id, title, lines in OVERVIEW_CHARTS:
                    yield TimeChart(title, [Line(*line) for line in lines], id=chart_id)
                yield SyncChart(id="chart-sync")
                yield EventsLog(id="events-tail", max_lines=200, compact=True)
            with TabPane("2 Distributions", id="distributions"), Horizontal(id="histograms"):
                yield HistogramChart(m.IS_HIST, "IS weights", xlabel="weight", id="hist-is")
                yield HistogramChart(
                    m.STALE_HIST, "trajectory staleness", xlabel="versions behind", id="hist-staleness"
                )
            with TabPane("3 Workers", id="workers"):
                yield WorkersTable(id="workers-table")
            with TabPane("4 Events", id="events"):
                yield EventsLog(id="events-log")
            with TabPane("5 Config", id="config"):
                yield ConfigView(id="config-view")
        yield Footer()

    def on_mount(self) -> None:
        # references taken now: while a modal is open, `query_one` would search the modal screen
        self.header = self.query_one(RunHeader)
        self.banner = self.query_one(DisconnectBanner)
        self.kpis = self.query_one(KpiRow)
        self.charts = [*self.query(TimeChart), self.query_one(SyncChart), *self.query(HistogramChart)]
        self.workers_table = self.query_one(WorkersTable)
        self.logs = list(self.query(EventsLog))
        self.config_view = self.query_one(ConfigView)
        self.query_one("#events-tail", EventsLog).border_title = "recent events"
        self._render_all([])
        self._poll()

    def on_unmount(self) -> None:
        self._stop.set()
        self._wake.set()

    # ---------------------------------------------------------------------------------- polling

    @work(thread=True, exclusive=True, group="poll", exit_on_error=False)
    def _poll(self) -> None:
        cursor = 0
        while not self._stop.is_set():
            try:
                snap = self.source.snapshot(cursor, self.model.history if cursor == 0 else None)
                new_cursor, restarted = next_cursor(cursor, snap)
                if restarted:
                    snap = self.source.snapshot(0, self.model.history)
                    new_cursor = int(snap.get("cursor", 0))
                self.buffer.put(snap, reset=restarted)
                cursor = new_cursor
                self.post_message(SnapshotReady())
            except Exception as err:  # noqa: BLE001 — any source failure becomes the banner, never a crash
                self.post_message(SourceFailed(one_line(err)))
            self.polls += 1
            self._wake.wait(self.poll_interval)
            self._wake.clear()

    def on_snapshot_ready(self, _message: SnapshotReady) -> None:
        snap, reset = self.buffer.drain()
        if snap is None:
            return
        if reset:
            self.model.reset()
            for log in self.logs:
                log.clear()
        new_metrics, new_events, changed = self.model.apply(snap)
        self._last_data_at = self.model.now
        self.banner.clear()
        if changed or reset:
            self._render_all(new_events, charts=bool(new_metrics) or reset)

    def on_source_failed(self, message: SourceFailed) -> None:
        self.model.mark_failed(message.error)
        self.banner.show_error(message.error, self._last_data_at, self.poll_interval)
        self.header.show(self.model, self.source.label, self.read_only)

    def _render_all(self, new_events: list[dict[str, Any]], charts: bool = True) -> None:
        self.header.show(self.model, self.source.label, self.read_only)
        self.kpis.show(self.model)
        self._show_tools()
        if charts:
            self._dirty_charts.update(self.charts)
        self._redraw_visible_charts()
        self.workers_table.show(self.model.worker_rows(), self.model.now)
        for log in self.logs:
            log.add_events(new_events)
        self.config_view.show(self.model.run.get("config") or {}, self.model.run.get("provenance") or {})

    def _show_tools(self) -> None:
        """A multi-turn run gets a "6 Tools" tab (added once its config or first tool metrics arrive)."""
        if not is_multi_turn(self.model) or not self.screen_stack:
            return
        if self.tools_panel is None:
            self.tools_panel = ToolsPanel(id="tools-panel")
            self.run_worker(self._add_tools_tab(self.tools_panel), group="tools-tab")
        elif self.tools_panel.is_mounted:
            self.tools_panel.show(self.model)

    async def _add_tools_tab(self, panel: ToolsPanel) -> None:
        await self.screen_stack[0].query_one(TabbedContent).add_pane(TabPane("6 Tools", panel, id="tools"))
        charts = list(panel.query(TimeChart))
        self.charts += charts
        self._dirty_charts.update(charts)
        panel.show(self.model)

    def _on_screen(self, chart: Any) -> bool:
        """Whether `chart` sits in the active tab (or outside the tabs); nothing is on screen once the app
        has closed its screens or removed their widgets (a chart timer or a snapshot can still arrive while the app
        shuts down)."""
        tabs = self.screen_stack[0].query(TabbedContent) if self.screen_stack else None
        if not tabs:  # closed, or its widgets already removed while a snapshot still arrives
            return False
        active = tabs.first().active
        pane = next((a for a in chart.ancestors if isinstance(a, TabPane)), None)
        return pane is None or pane.id == active

    @property
    def charts_pending(self) -> int:
        """How many on-screen charts still wait for their rate-limited redraw (0 = the screen is current)."""
        return sum(1 for chart in self._dirty_charts if self._on_screen(chart))

    def _redraw_visible_charts(self, force: bool = False) -> None:
        """Rebuild dirty charts that are on screen, at most once per `chart_interval` seconds.

        Plotext rendering is the dashboard's main cost; hidden charts stay dirty until their tab shows, and
        a burst of records within the interval costs one redraw (a timer picks up the rest).
        """
        wait = self._last_chart_draw + self.chart_interval - time.monotonic()
        if wait > 0 and not force:
            if self._chart_timer is None:
                self._chart_timer = self.set_timer(wait, self._chart_timer_fired)
            return
        for chart in list(self._dirty_charts):
            if self._on_screen(chart):
                chart.redraw(self.model)
                self._dirty_charts.discard(chart)
        self._last_chart_draw = time.monotonic()

    def _chart_timer_fired(self) -> None:
        self._chart_timer = None
        self._redraw_visible_charts()

    def on_tabbed_content_tab_activated(self, _event: TabbedContent.TabActivated) -> None:
        self._redraw_visible_charts(force=True)

    # ---------------------------------------------------------------------------------- actions

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Mutating actions do not exist in a read-only session (hidden from the footer, not runnable)."""
        return not (self.read_only and action in MUTATING_ACTIONS)

    def _refused(self) -> bool:
        if self.read_only:
            self.last_result = {"ok": False, "reason": READ_ONLY_REFUSAL}
            self.notify(READ_ONLY_REFUSAL, severity="warning")
        return self.read_only

    def action_show_tab(self, tab: str) -> None:
        self.screen_stack[0].query_one(TabbedContent).active = tab

    def action_help(self) -> None:
        self.push_screen(HelpScreen(self.read_only))

    def action_detach(self) -> None:
        self.exit(0)

    def action_refresh(self) -> None:
        self._wake.set()

    def action_knob(self, name: str) -> None:
        """A knob's key or palette entry: a bool toggles (confirmed), a number opens its input."""
        knob = KNOBS[name]
        if knob.kind is bool:
            self._toggle_knob(name)
        else:
            self._edit_knob(name, knob.title or name)

    def _edit_knob(self, name: str, title: str) -> None:
        """Input (validated) → confirmation (old → new, warnings) → compare-and-set at the version seen."""
        if self._refused():
            return
        knob = self.model.knob(name)
        if not knob:
            self.notify("no data from the run yet", severity="warning")
            return
        expected, old = knob.get("version"), knob.get("value")

        def confirmed(ok: bool | None) -> None:
            if ok:
                self._mutate(f"{name} → {value!r}", lambda: self.source.set_knob(name, value, expected))

        def entered(new: Any) -> None:
            nonlocal value
            if new is None:
                return
            value = new
            ask = describe_knob_change(name, old, new, self.model.run.get("config") or {}, self.model.knobs)
            self.push_screen(ConfirmScreen(ask.title, ask.body, ask.warnings), confirmed)

        value: Any = None
        self.push_screen(KnobInputScreen(name, old, title), entered)

    def _toggle_knob(self, name: str) -> None:
        if self._refused():
            return
        knob = self.model.knob(name)
        if not knob:
            self.notify("no data from the run yet", severity="warning")
            return
        new, expected = not bool(knob.get("value")), knob.get("version")
        ask = describe_knob_change(name, not new, new, self.model.run.get("config") or {}, self.model.knobs)
        self._confirm_then(
            ask.title,
            ask.body,
            ask.warnings,
            KNOBS[name].verb(new).lower(),
            lambda: self.source.set_knob(name, new, expected),
        )

    def action_checkpoint(self) -> None:
        if self._refused():
            return
        self._confirm_then(
            "Checkpoint now?",
            "The trainer writes a checkpoint at its next local-step boundary.",
            [],
            "checkpoint",
            lambda: self.source.request_action("checkpoint"),
        )

    def action_stop_run(self) -> None:
        if self._refused():
            return
        self._confirm_then(
            "Stop the run?",
            "The trainer checkpoints and finishes at its next local-step "
            "boundary. This ends the run for everyone (q only detaches).",
            ["this cannot be undone from the dashboard; resume with `asyncrl launch --resume`"],
            "stop",
            lambda: self.source.request_action("stop"),
        )

    def _confirm_then(
        self, title: str, body: str, warnings: list[str], what: str, call: Callable[[], dict[str, Any]]
    ) -> None:
        def confirmed(ok: bool | None) -> None:
            if ok:
                self._mutate(what, call)

        self.push_screen(ConfirmScreen(title, body, warnings), confirmed)

    @work(thread=True, group="mutate", exit_on_error=False)
    def _mutate(self, what: str, call: Callable[[], dict[str, Any]]) -> None:
        try:
            result = dict(call())
        except Exception as err:  # noqa: BLE001 — shown to the operator, never a crash
            result = {"ok": False, "reason": one_line(err)}
        self.call_from_thread(self._report, what, result)

    def _report(self, what: str, result: dict[str, Any]) -> None:
        self.last_result = result
        if result.get("ok"):
            self.notify(f"{what}: {result.get('reason', 'ok')}", title="requested")
        else:
            self.notify(
                f"{what} rejected: {result.get('reason', 'unknown reason')}",
                title="rejected",
                severity="error",
                timeout=8,
            )
        self._wake.set()
