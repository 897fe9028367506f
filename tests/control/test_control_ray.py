"""The named RunController on a real local Ray, driven through ControlClient (what the TUI, `ctl` and
`status` use), the CLI commands, and the dashboard itself."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from asyncrl_cli.commands._control import control_exit_code
from engine.loop.knobs import TRAINER, KnobChange, KnobInbox

pytestmark = pytest.mark.integration

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def ray_session() -> Iterator[None]:
    started = not ray.is_initialized()
    if started:
        ray.init(
            address="local",
            num_cpus=1,
            include_dashboard=False,
            namespace="asyncrl-test",
            log_to_driver=False,
            logging_level="ERROR",
            object_store_memory=100 * 2**20,
        )
    yield
    if started:
        ray.shutdown()


@pytest.fixture
def run(ray_session: None, tmp_path: Path) -> Iterator[tuple[str, Any, Path]]:
    from engine.control.controller import create_run_controller

    name = f"itest-{uuid.uuid4().hex[:8]}"
    config = {
        "name": name,
        "async_training": {"trigger_parameter_sync_step": 4, "staleness_threshold": 0.5},
        "trainer": {"ppo_mini_batch_size": 4},
    }
    handle = create_run_controller(name, run_dir=str(tmp_path), config=config, total_steps=20)
    ray.get(
        handle.record_metrics.remote(
            {"training/global_step": 3, "fully_async/count/current_param_version": 0}
        )
    )
    yield name, handle, tmp_path
    ray.kill(handle, no_restart=True)


def events(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]


def test_client_changes_a_knob_and_the_ack_is_audited(run: tuple[str, Any, Path]) -> None:
    from engine.control.client import ControlClient

    name, handle, run_dir = run
    alice = ControlClient(name, who="alice@lab")
    bob = ControlClient(name, who="bob@lab")
    assert name in alice.list_runs()
    assert alice.snapshot(0)["metrics"][0]["training/global_step"] == 3
    seen = alice.get_knobs()["trigger_parameter_sync_step"]["version"]
    assert alice.set_knob("trigger_parameter_sync_step", 2, expected_version=seen)["ok"]
    conflict = bob.set_knob("trigger_parameter_sync_step", 8, expected_version=seen)
    assert not conflict["ok"] and "alice@lab" in conflict["reason"]
    out_of_range = bob.set_knob("trigger_parameter_sync_step", 5000)
    assert not out_of_range["ok"] and "out of range" in out_of_range["reason"]
    # the trainer's side: read the pending change at a local-step boundary, apply, acknowledge
    pending = KnobInbox(TRAINER).take(ray.get(handle.get_knobs.remote()))
    assert pending == [KnobChange("trigger_parameter_sync_step", 2, 1, owned=True)]
    assert ray.get(handle.ack_knob.remote("trigger_parameter_sync_step", 1, 4))["ok"]
    applied = [e for e in events(run_dir) if e.get("phase") == "applied"]
    assert len(applied) == 1
    ev = applied[0]
    assert (ev["old"], ev["new"], ev["who"], ev["requested_step"], ev["applied_step"]) == (
        4,
        2,
        "alice@lab",
        3,
        4,
    )
    assert ev["time"] >= ev["requested_at"] > time.time() - 600
    assert alice.get_knobs()["trigger_parameter_sync_step"]["pending"] is False


def test_run_lookup_errors_name_the_live_runs(run: tuple[str, Any, Path]) -> None:
    from engine.control.client import AmbiguousRunError, ControlClient, RunNotFoundError
    from engine.control.controller import create_run_controller

    name, _, _ = run
    with pytest.raises(RunNotFoundError, match=name) as err:
        ControlClient("no-such-run")
    assert control_exit_code(err.value) == 4
    assert ControlClient(None).run_name == name
    other = create_run_controller(f"{name}-b", sinks=[])
    try:
        with pytest.raises(AmbiguousRunError, match="several runs") as amb:
            ControlClient(None)
        assert control_exit_code(amb.value) == 2
    finally:
        ray.kill(other, no_restart=True)


def test_a_dead_controller_becomes_source_unavailable(ray_session: None) -> None:
    from engine.control.client import ControlClient, SourceUnavailable
    from engine.control.controller import create_run_controller

    name = f"itest-dead-{uuid.uuid4().hex[:6]}"
    handle = create_run_controller(name, sinks=[])
    client = ControlClient(name, timeout_s=60)  # generous: actor start-up is slow on a loaded machine
    assert client.snapshot(0)["run"]["name"] == name
    ray.kill(handle, no_restart=True)  # asynchronous: calls already queued may still be answered
    deadline = time.monotonic() + 20
    with pytest.raises(SourceUnavailable):
        while time.monotonic() < deadline:
            client.snapshot(0)
            time.sleep(0.2)


def test_cli_ctl_status_and_attach_against_the_live_run(run: tuple[str, Any, Path]) -> None:
    from typer.testing import CliRunner

    from asyncrl_cli.app import app

    name, handle, run_dir = run
    cli = CliRunner()
    ok = cli.invoke(app, ["ctl", name, "set", "trigger_parameter_sync_step", "2", "--expect-version", "0"])
    assert ok.exit_code == 0, ok.output
    assert "pending" in ok.output
    stale = cli.invoke(app, ["ctl", name, "set", "trigger_parameter_sync_step", "3", "--expect-version", "0"])
    assert stale.exit_code == 1 and "version conflict" in stale.output and "Traceback" not in stale.output
    bad = cli.invoke(app, ["ctl", name, "set", "staleness_threshold", "-1"])
    assert bad.exit_code == 1 and "out of range" in bad.output
    assert cli.invoke(app, ["ctl", name, "pause"]).exit_code == 0
    assert cli.invoke(app, ["ctl", name, "checkpoint"]).exit_code == 0
    assert ray.get(handle.take_actions.remote("trainer", 5)) == ["checkpoint"]
    status = cli.invoke(app, ["status", name, "--json"])
    assert status.exit_code == 0, status.output
    doc = json.loads(status.output)
    assert doc["run"] == name and doc["step"] == 3 and doc["total_steps"] == 20
    assert doc["knobs"]["trigger_parameter_sync_step"]["pending"] is True
    assert doc["knobs"]["paused"]["value"] is True
    snap = json.loads(cli.invoke(app, ["attach", name, "--json", "--once"]).output)
    assert snap["run"]["name"] == name and snap["cursor"] >= 1
    missing = cli.invoke(app, ["status", "no-such-run"])
    assert missing.exit_code == 4 and "no run named" in missing.output
    kinds = {(e.get("knob") or e.get("action"), e.get("phase")) for e in events(run_dir)}
    assert {
        ("trigger_parameter_sync_step", "requested"),
        ("paused", "requested"),
        ("checkpoint", "requested"),
        ("checkpoint", "applied"),
    } <= kinds


async def test_dashboard_changes_the_sync_interval_over_ray(run: tuple[str, Any, Path]) -> None:
    from asyncrl_cli.tui import make_app
    from engine.control.client import ControlClient
    from tests.tui.helpers import answer_confirmation, open_knob_input, wait_until

    name, handle, _ = run
    app = make_app(ControlClient(name, who="tui@test"), poll_interval=0.2)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_until(pilot, lambda: app.model.received, 30)
        await open_knob_input(pilot, "s")
        await pilot.press("2", "enter")
        await answer_confirmation(pilot, "y")
        await wait_until(pilot, lambda: app.last_result is not None, 30)
        assert app.last_result["ok"], app.last_result
    knob = ray.get(handle.get_knobs.remote())["trigger_parameter_sync_step"]
    assert (knob["value"], knob["pending"], knob["requested_by"]) == (2, True, "tui@test")
