"""Pilot tests of the dashboard: panels show the recorded run; knob flows reach a real ControllerCore;
read-only hides and refuses mutations; the disconnect banner comes and goes; `q` only detaches."""

from __future__ import annotations

from typing import Any

from textual.widgets import Input

from asyncrl_cli.tui import make_app
from asyncrl_cli.tui import model as m
from asyncrl_cli.tui.app import DashboardApp
from asyncrl_cli.tui.commands import palette_commands
from asyncrl_cli.tui.format import flatten, fmt_rate
from asyncrl_cli.tui.screens.confirm import ConfirmScreen
from asyncrl_cli.tui.screens.help import HelpScreen
from asyncrl_cli.tui.screens.knob_input import KnobInputScreen
from asyncrl_cli.tui.widgets.banner import DisconnectBanner
from asyncrl_cli.tui.widgets.config_view import ConfigView
from asyncrl_cli.tui.widgets.events_log import EventsLog
from asyncrl_cli.tui.widgets.histogram_chart import HistogramChart
from asyncrl_cli.tui.widgets.kpi_row import Kpi
from asyncrl_cli.tui.widgets.run_header import RunHeader
from asyncrl_cli.tui.widgets.sync_chart import SyncChart
from asyncrl_cli.tui.widgets.time_chart import TimeChart
from asyncrl_cli.tui.widgets.workers_table import WorkersTable
from engine.control.client import LocalSource
from engine.control.core import ControllerCore
from tests.tui.helpers import (
    SIZE,
    FlakySource,
    answer_confirmation,
    fixture_config,
    fixture_lines,
    open_knob_input,
    replay_source,
    wait_until,
)

MUTATING_KEYS = {"s", "t", "p", "c"}


def text_of(app: DashboardApp, selector: str) -> str:
    return str(app.screen.query_one(selector).content)


async def started(pilot: Any) -> DashboardApp:
    app = pilot.app
    await wait_until(pilot, lambda: app.model.received and not app.charts_pending)
    await pilot.pause()
    return app


async def test_every_panel_renders_the_recorded_run() -> None:
    metrics, events = fixture_lines("metrics.jsonl"), fixture_lines("events.jsonl")
    config, _ = fixture_config()
    last = metrics[-1]
    async with make_app(replay_source(), poll_interval=0.05).run_test(size=SIZE) as pilot:
        app = await started(pilot)
        header = str(app.query_one(RunHeader).content)
        assert config.get("name", "run_tiny") in header and "replay run_tiny" in header
        assert f"step {last['training/global_step']}/" in header and "read-only" in header
        if any(e["kind"] == "finish" for e in events):
            assert "FINISHED" in header or "FAILED" in header
        assert str(app.query_one("#kpi-trainer", Kpi).content) == fmt_rate(last[m.TRAINER_TPS])
        assert str(app.query_one("#kpi-rollout", Kpi).content) == fmt_rate(last[m.ROLLOUT_TPS])
        assert str(app.query_one("#kpi-queue", Kpi).content) == str(last[m.QUEUE])
        assert "≤" in str(app.query_one("#kpi-staleness", Kpi).content)
        assert str(app.query_one("#kpi-sync", Kpi).content) == f"{last['asyncrl/sync_interval']} steps"
        charts = list(app.query(TimeChart))
        expected = {
            chart.id: {
                line.key: n
                for line in chart.lines
                if (n := sum(1 for r in metrics if r.get(line.key) is not None))
            }
            for chart in charts
        }
        assert all(expected.values()), "every overview chart has data in the recording"
        # charts redraw at most once per chart interval, so the first draw may trail the first poll
        await wait_until(pilot, lambda: all(chart.plotted for chart in charts))
        for chart in charts:
            assert chart.plotted == expected[chart.id], chart.id
        syncs = sum(1 for r in metrics if m.SYNC_PAUSE in r)
        assert app.query_one(SyncChart).bars == min(syncs, 12) > 0
        hists = list(app.query(HistogramChart))
        assert all(h.total == 0 for h in hists), "hidden charts are drawn only when their tab shows"
        await pilot.press("2")
        await wait_until(pilot, lambda: all(h.total > 0 for h in hists))
        for hist in hists:
            expected_total = sum(sum(r[hist.key]["counts"]) for r in metrics[-hist.window :])
            assert hist.total == expected_total
        assert app.query_one(WorkersTable).row_count == len(app.model.workers) >= 2
        log = app.query_one("#events-log", EventsLog)
        assert log.count == len(events)
        assert log.warnings == sum(1 for e in events if e.get("level") in ("warning", "error"))
        table = app.query_one(ConfigView)
        assert table.row_count == len(flatten(config))


async def test_config_tab_shows_where_values_came_from() -> None:
    config, provenance = fixture_config()
    keys = provenance.get("keys", {})
    async with make_app(replay_source(), poll_interval=0.05).run_test(size=SIZE) as pilot:
        app = await started(pilot)
        await pilot.press("5")
        table = app.query_one(ConfigView)
        for key, origin in list(keys.items())[:3]:
            if key in dict(flatten(config)):
                assert str(table.get_cell(key, "source")) == origin["where"]


async def test_sync_interval_flow_validates_confirms_and_sets(
    core: ControllerCore, local: LocalSource
) -> None:
    async with make_app(local, poll_interval=0.05).run_test(size=SIZE) as pilot:
        app = await started(pilot)
        assert str(app.query_one("#kpi-sync", Kpi).content) == "4 steps"
        await open_knob_input(pilot, "s")
        await pilot.press("0", "enter")
        assert isinstance(app.screen, KnobInputScreen), "out-of-range value must not pass"
        assert "out of range" in text_of(app, "#knob-error")
        app.screen.query_one(Input).value = "two"
        await pilot.press("enter")
        assert "must be an integer" in text_of(app, "#knob-error")
        app.screen.query_one(Input).value = ""
        await pilot.press("2", "enter")
        await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        assert "4 → 2" in text_of(app, "#confirm-body")
        await pilot.press("y")
        await wait_until(pilot, lambda: app.last_result is not None)
        assert app.last_result["ok"], app.last_result
        knob = core.get_knobs()["trigger_parameter_sync_step"]
        assert (knob["value"], knob["version"], knob["pending"], knob["requested_by"]) == (
            2,
            1,
            True,
            "operator@test",
        )
        await wait_until(pilot, lambda: "pending" in str(app.query_one("#kpi-sync", Kpi).content))
        core.ack_knob("trigger_parameter_sync_step", 1, 41)
        await wait_until(pilot, lambda: str(app.query_one("#kpi-sync", Kpi).content) == "2 steps")
        applied = [e for e in app.model.events if e.get("phase") == "applied"]
        assert applied and applied[-1]["who"] == "operator@test" and applied[-1]["applied_step"] == 41


async def test_a_concurrent_change_is_rejected_not_overwritten(
    core: ControllerCore, local: LocalSource
) -> None:
    async with make_app(local, poll_interval=0.05).run_test(size=SIZE) as pilot:
        app = await started(pilot)
        await open_knob_input(pilot, "s")
        core.set_knob("trigger_parameter_sync_step", 8, expected_version=0, who="someone@else")
        await pilot.press("2", "enter")
        await answer_confirmation(pilot, "y")
        await wait_until(pilot, lambda: app.last_result is not None)
        assert not app.last_result["ok"] and "version conflict" in app.last_result["reason"]
        assert core.get_knobs()["trigger_parameter_sync_step"]["value"] == 8


async def test_cancel_at_either_step_changes_nothing(core: ControllerCore, local: LocalSource) -> None:
    async with make_app(local, poll_interval=0.05).run_test(size=SIZE) as pilot:
        app = await started(pilot)
        await open_knob_input(pilot, "s")
        await pilot.press("escape")
        await open_knob_input(pilot, "t")
        await pilot.press("1", "enter")
        await answer_confirmation(pilot, "n")
        await pilot.pause()
        assert not isinstance(app.screen, (KnobInputScreen, ConfirmScreen))
        assert all(k["version"] == 0 for k in core.get_knobs().values())


async def test_staleness_pause_and_checkpoint_reach_the_controller(
    core: ControllerCore, local: LocalSource
) -> None:
    async with make_app(local, poll_interval=0.05).run_test(size=SIZE) as pilot:
        app = await started(pilot)
        await open_knob_input(pilot, "t")
        await pilot.press("1", ".", "5", "enter")
        await answer_confirmation(pilot, "y")
        await wait_until(pilot, lambda: core.get_knobs()["staleness_threshold"]["value"] == 1.5)
        app.last_result = None
        await pilot.press("p")
        await answer_confirmation(pilot, "y")
        await wait_until(pilot, lambda: core.get_knobs()["paused"]["value"] is True)
        await pilot.press("c")
        await answer_confirmation(pilot, "y")
        await wait_until(pilot, lambda: core.snapshot()["events"][-1].get("action") == "checkpoint")
        assert core.take_actions("trainer") == ["checkpoint"]


async def test_read_only_hides_and_refuses_every_mutation(core: ControllerCore, local: LocalSource) -> None:
    async with make_app(local, read_only=True, poll_interval=0.05).run_test(size=SIZE) as pilot:
        app = await started(pilot)
        assert not MUTATING_KEYS & set(app.screen.active_bindings)
        for key in ("s", "t", "p", "c"):
            await pilot.press(key)
            assert not isinstance(app.screen, (KnobInputScreen, ConfirmScreen))
        await app.run_action("knob('trigger_parameter_sync_step')")
        app.action_stop_run()
        assert app.last_result == {"ok": False, "reason": "read-only session: changes are disabled"}
        names = [name for name, _, _ in palette_commands(app)]
        assert "Detach" in names and not any(
            n.startswith(("Set", "Pause", "Checkpoint", "Stop")) for n in names
        )
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
    assert all(k["version"] == 0 for k in core.get_knobs().values())
    assert core.take_actions("trainer") == []


async def test_replay_is_always_read_only() -> None:
    async with make_app(replay_source(), poll_interval=0.05).run_test(size=SIZE) as pilot:
        app = await started(pilot)
        assert app.read_only and not MUTATING_KEYS & set(app.screen.active_bindings)


async def test_disconnect_banner_appears_and_clears(local: LocalSource) -> None:
    source = FlakySource(local)
    async with make_app(source, poll_interval=0.05).run_test(size=SIZE) as pilot:
        app = await started(pilot)
        banner = app.query_one(DisconnectBanner)
        assert not banner.shown
        source.failing = True
        await wait_until(pilot, lambda: banner.shown)
        assert "actor died" in str(banner.content) and "retrying" in str(banner.content)
        assert "DISCONNECTED" in str(app.query_one(RunHeader).content)
        assert app.model.metrics, "data already shown is kept while disconnected"
        source.failing = False
        await wait_until(pilot, lambda: not banner.shown)
        assert "DISCONNECTED" not in str(app.query_one(RunHeader).content)


async def test_q_detaches_and_leaves_the_run_alone(core: ControllerCore, local: LocalSource) -> None:
    async with make_app(local, poll_interval=0.05).run_test(size=SIZE) as pilot:
        await started(pilot)
        await pilot.press("q")
    assert pilot.app.return_code == 0
    assert core.snapshot()["state"] == "running" and core.take_actions("trainer") == []


async def test_new_records_are_appended_live(core: ControllerCore, local: LocalSource) -> None:
    async with make_app(local, poll_interval=0.05).run_test(size=SIZE) as pilot:
        app = await started(pilot)
        before = app.query_one("#events-log", EventsLog).count
        core.record_metrics(
            {**core.snapshot()["metrics"][-1], "training/global_step": 999, m.TRAINER_TPS: 4321.0}
        )
        core.record_event({"kind": "error", "level": "error", "message": "replica 1 died"})
        await wait_until(pilot, lambda: str(app.query_one("#kpi-trainer", Kpi).content) == "4.32k")
        log = app.query_one("#events-log", EventsLog)
        assert log.count == before + 1 and log.warnings >= 1


async def test_a_chart_redraw_pending_at_exit_does_not_crash_the_closing_app() -> None:
    """A rate-limited chart redraw can fire while the app tears its screens down (seen in CI): it must be a
    no-op there, not an IndexError that turns a clean detach into a traceback."""
    app = make_app(replay_source(), poll_interval=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        app.chart_interval = 3600.0
        app._dirty_charts.update(app.charts)
        app._redraw_visible_charts()
        assert app._chart_timer is not None, "the redraw waits for its timer"
        await pilot.press("q")
    assert not app.screen_stack
    app._chart_timer_fired()
    assert app.charts_pending == 0
