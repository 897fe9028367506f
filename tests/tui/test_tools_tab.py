"""A multi-turn run's dashboard gets a tools tab: calls and turns per trajectory, the failure shares, latency,
calls waiting against `max_concurrent_tools` (the recorded run, made multi-turn: its config turned on and
tool metrics added to its records)."""

from __future__ import annotations

import json
import shutil

from asyncrl_cli.tui import make_app
from asyncrl_cli.tui.widgets.time_chart import TimeChart
from asyncrl_cli.tui.widgets.tools_panel import ToolsPanel
from engine.control.replay import ReplaySource
from tests.tui.helpers import FIXTURE, SIZE, wait_until

TOOLS = {"asyncrl/tools/calls": 40, "asyncrl/tools/calls_per_trajectory": 1.25, "num_turns/mean": 2.5,
         "asyncrl/tools/status/error": 4, "asyncrl/tools/status/timeout": 6, "asyncrl/tools/status/limit": 0,
         "asyncrl/tools/status/refused": 0, "asyncrl/tools/latency_s/p50": 0.031, "asyncrl/tools/latency_s/p99": 1.5,
         "asyncrl/tools/waiting": 3, "asyncrl/tools/instances": 5}


def _multi_turn_run(tmp_path, refused: int = 0):
    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    cfg = json.loads((run / "config.resolved.json").read_text())
    cfg["rollout"].setdefault("multi_turn", {}).update(enable=True, tools=["calculator"], max_concurrent_tools=8)
    (run / "config.resolved.json").write_text(json.dumps(cfg))
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    extra = dict(TOOLS, **{"asyncrl/tools/status/refused": refused})
    (run / "metrics.jsonl").write_text("".join(json.dumps({**r, **extra}) + "\n" for r in lines))
    source = ReplaySource(run)
    source.label = "replay tools"
    return source


async def test_the_tools_tab_shows_calls_failures_latency_and_slots(tmp_path):
    async with make_app(_multi_turn_run(tmp_path), poll_interval=0.05).run_test(size=SIZE) as pilot:
        app = pilot.app
        await wait_until(pilot, lambda: app.tools_panel is not None and app.tools_panel.is_mounted)
        await pilot.pause()
        app.action_show_tab("tools")
        await wait_until(pilot, lambda: not app.charts_pending)
        tile = str(app.screen.query_one("#tools-summary").content)
        assert "calls / trajectory  1.25" in tile and "turns / trajectory  2.5" in tile
        assert "error 10.0%" in tile and "timeout 15.0%" in tile and "refused 0.0%" in tile
        assert "p50 0.031 s" in tile and "p99 1.5 s" in tile and "waiting 3 / 8 slots" in tile
        assert "instances 5" in tile  # stateful class tools' boxes alive
        assert app.screen.query_one("#tools-summary").has_class("-warn")  # 15 % timeouts
        charts = list(app.screen.query_one(ToolsPanel).query(TimeChart))
        assert all(sum(c.plotted.values()) > 0 for c in charts)


async def test_refused_calls_turn_the_tile_red_and_single_turn_runs_have_no_tab(tmp_path):
    async with make_app(_multi_turn_run(tmp_path, refused=2), poll_interval=0.05).run_test(size=SIZE) as pilot:
        app = pilot.app
        await wait_until(pilot, lambda: app.tools_panel is not None and app.tools_panel.is_mounted)
        await pilot.pause()
        assert app.screen.query_one("#tools-summary").has_class("-alert")
    source = ReplaySource(FIXTURE)
    async with make_app(source, poll_interval=0.05).run_test(size=SIZE) as pilot:
        app = pilot.app
        await wait_until(pilot, lambda: app.model.received)
        await pilot.pause()
        assert app.tools_panel is None and not list(app.screen.query(ToolsPanel))
