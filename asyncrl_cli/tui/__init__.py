"""The `asyncrl attach` dashboard (Textual). Textual is imported only when a dashboard is built."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from asyncrl_cli.tui.app import DashboardApp
    from engine.control.client import MetricsSource

T = TypeVar("T")


def make_app(source: MetricsSource, read_only: bool = False, poll_interval: float = 1.0) -> DashboardApp:
    """Build (not run) the dashboard app over `source`; used by `run_dashboard` and the tests."""
    from asyncrl_cli.tui.app import DashboardApp

    return DashboardApp(source, read_only=read_only, poll_interval=poll_interval)


def run_dashboard(source: MetricsSource, read_only: bool = False, poll_interval: float = 1.0) -> int:
    """Run the dashboard in this terminal until the user detaches (`q`); the run itself goes on.

    Returns the app's exit code (0 on detach). Called by `asyncrl attach` and `asyncrl launch --tui`.
    """
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError(
            "run_dashboard must run on the main thread (Textual installs signal handlers); "
            "run the work beside it with run_dashboard_with(source, work)"
        )
    app = make_app(source, read_only=read_only, poll_interval=poll_interval)
    code = app.run()
    return int(code or 0)


def run_dashboard_with(
    source: MetricsSource, work: Callable[[], T], read_only: bool = False, poll_interval: float = 1.0
) -> T:
    """Run `work` (the driver loop) in a thread while the dashboard owns this, the main, thread.

    Textual's terminal driver installs signal handlers, which Python allows only on the main thread, so
    `launch --tui` must put the dashboard here and the run beside it. After the user detaches (`q`) this
    waits for `work` and returns its result (re-raising its exception).
    """
    outcome: dict[str, object] = {}

    def target() -> None:
        try:
            outcome["value"] = work()
        except BaseException as err:  # noqa: BLE001 — re-raised on the main thread below
            outcome["error"] = err

    thread = threading.Thread(target=target, name="asyncrl-run", daemon=True)
    thread.start()
    run_dashboard(source, read_only=read_only, poll_interval=poll_interval)
    thread.join()
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome["value"]  # type: ignore[return-value]
