"""SVG snapshots of the dashboard at a fixed terminal size (pytest-textual-snapshot).

Deterministic by construction: the recorded run (or a ControllerCore with a frozen clock), event times in
UTC (see conftest), input cursors not blinking. Update deliberately with `--snapshot-update`.
"""

from __future__ import annotations

from typing import Any

from textual.widgets import Input

from asyncrl_cli.tui import make_app
from asyncrl_cli.tui.screens.confirm import ConfirmScreen
from engine.control.client import LocalSource
from tests.tui.helpers import SIZE, FlakySource, live_core, open_knob_input, replay_source, wait_until


async def ready(pilot: Any) -> None:
    """Data received and every on-screen chart drawn (chart redraws are rate-limited)."""
    await wait_until(pilot, lambda: pilot.app.model.received and not pilot.app.charts_pending)
    await pilot.pause()


def no_blink(pilot: Any) -> None:
    for field in pilot.app.screen.query(Input):
        field.cursor_blink = False


def live_app() -> Any:
    return make_app(LocalSource(live_core(), who="operator@test", label="127.0.0.1:6379"), poll_interval=0.05)


class TestReplayLook:
    def test_overview(self, snap_compare: Any) -> None:
        assert snap_compare(
            make_app(replay_source(), poll_interval=0.05), terminal_size=SIZE, run_before=ready
        )

    def test_distributions(self, snap_compare: Any) -> None:
        async def run_before(pilot: Any) -> None:
            await ready(pilot)
            await pilot.press("2")
            await ready(pilot)

        assert snap_compare(
            make_app(replay_source(), poll_interval=0.05), terminal_size=SIZE, run_before=run_before
        )

    def test_workers(self, snap_compare: Any) -> None:
        async def run_before(pilot: Any) -> None:
            await ready(pilot)
            await pilot.press("3")
            await ready(pilot)

        assert snap_compare(
            make_app(replay_source(), poll_interval=0.05), terminal_size=SIZE, run_before=run_before
        )


class TestKnobFlowLook:
    def test_input_rejects_out_of_range(self, snap_compare: Any) -> None:
        async def run_before(pilot: Any) -> None:
            await ready(pilot)
            await open_knob_input(pilot, "s")
            await pilot.press("0")
            no_blink(pilot)
            await pilot.pause()

        assert snap_compare(live_app(), terminal_size=SIZE, run_before=run_before)

    def test_confirmation_shows_old_and_new(self, snap_compare: Any) -> None:
        async def run_before(pilot: Any) -> None:
            await ready(pilot)
            await open_knob_input(pilot, "s")
            await pilot.press("2", "enter")
            await wait_until(pilot, lambda: isinstance(pilot.app.screen, ConfirmScreen))
            await pilot.pause()

        assert snap_compare(live_app(), terminal_size=SIZE, run_before=run_before)


class TestDisconnectLook:
    def test_banner(self, snap_compare: Any) -> None:
        source = FlakySource(LocalSource(live_core(), who="operator@test", label="127.0.0.1:6379"))
        app = make_app(source, poll_interval=0.05)

        async def run_before(pilot: Any) -> None:
            await ready(pilot)
            source.failing = True
            await wait_until(pilot, lambda: app.query_one("#banner").has_class("-shown"))
            await pilot.pause()

        assert snap_compare(app, terminal_size=SIZE, run_before=run_before)
