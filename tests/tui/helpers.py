"""Helpers for the dashboard tests: the recorded run, a real ControllerCore source, a flaky source."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.control.client import SourceUnavailable
from engine.control.replay import ReplaySource
from engine.control.core import ControllerCore

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "run_tiny"
SIZE = (120, 40)


def fixture_lines(name: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (FIXTURE / name).read_text().splitlines() if x.strip()]


def fixture_config() -> tuple[dict[str, Any], dict[str, Any]]:
    from engine.control.replay import load_resolved_config

    return load_resolved_config(FIXTURE)


def replay_source() -> ReplaySource:
    """The recorded run, with a machine-independent label for snapshots."""
    source = ReplaySource(FIXTURE)
    source.label = "replay run_tiny"
    return source


def live_core() -> ControllerCore:
    """A real ControllerCore holding the recorded run's records (knobs from its config, state running)."""
    config, provenance = fixture_config()
    events = fixture_lines("events.jsonl")
    start = events[0]["time"] if events else 0.0
    metrics = fixture_lines("metrics.jsonl")
    now = [start]
    core = ControllerCore(
        config.get("name", "tiny"),
        config=config,
        provenance=provenance,
        sinks=[],
        total_steps=len(metrics) + 10,
        address="127.0.0.1:6379",
        clock=lambda: now[0],
    )
    for record in metrics:
        now[0] = start + float(record.get("asyncrl/time", 0.0))
        core.record_metrics(record)
    for event in events:
        if event.get("kind") not in ("knob", "finish"):
            core.record_event(event)
    for wid in ("trainer-0", "rollout-0"):
        core.update_worker(
            wid,
            {
                "kind": "trainer" if wid.startswith("trainer") else "rollout",
                "state": "running",
                "version": metrics[-1].get("fully_async/count/current_param_version"),
            },
        )
    return core


class FlakySource:
    """Wraps a source; while `failing` is set, every snapshot raises like a lost controller."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.read_only = inner.read_only
        self.label = inner.label
        self.failing = False

    def snapshot(self, since: int = 0, limit: int | None = None) -> dict[str, Any]:
        if self.failing:
            raise SourceUnavailable("lost the controller of 'tiny': actor died")
        return self.inner.snapshot(since, limit)

    def set_knob(self, name: str, value: Any, expected_version: int | None = None) -> dict[str, Any]:
        return self.inner.set_knob(name, value, expected_version)

    def request_action(self, name: str) -> dict[str, Any]:
        return self.inner.request_action(name)


async def wait_until(pilot: Any, condition: Callable[[], bool], timeout: float = 10.0) -> None:
    """Let the app run until `condition()` holds (fails the test after `timeout` seconds)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await pilot.pause(0.02)


async def open_knob_input(pilot: Any, key: str) -> None:
    """Press `key` and wait until the knob input modal is up with its field focused (keys typed earlier
    would reach the dashboard instead)."""
    from textual.widgets import Input

    from asyncrl_cli.tui.screens.knob_input import KnobInputScreen

    await pilot.press(key)
    await wait_until(
        pilot, lambda: isinstance(pilot.app.screen, KnobInputScreen) and isinstance(pilot.app.focused, Input)
    )


async def answer_confirmation(pilot: Any, answer: str) -> None:
    """Wait for the confirmation modal, then press `answer` (`y` or `n`)."""
    from asyncrl_cli.tui.screens.confirm import ConfirmScreen

    await wait_until(pilot, lambda: isinstance(pilot.app.screen, ConfirmScreen))
    await pilot.press(answer)
