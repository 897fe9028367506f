"""Acceptance (issue 47): the knob table is the one place a knob is written. A knob added to it in-process —
without touching `ctl`, the dashboard or resume — shows in `ctl set`'s help and is set through it, gets a dashboard
key, help row, palette entry and its own preview in the confirmation, is routed to its owner and followers, and
a resume starts from the value its checkpoint holds. The built-in knobs resume the same way (staleness not in sync
mode, where it is refused)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from asyncrl_cli.app import app as cli_app
from asyncrl_cli.config import load_run_config
from engine.control.client import LocalSource
from engine.control.core import ControllerCore
from engine.control.knobs import knobs_at_checkpoint
from engine.control.knob_table import KNOBS, ROLLOUTER, TRAINER, Knob, Preview, PreviewContext
from engine.loop.knobs import KnobChange, KnobInbox
from tests.tui.helpers import SIZE, answer_confirmation, live_core, open_knob_input, wait_until

TINY = Path(__file__).resolve().parents[2] / "presets" / "runs" / "tiny-cpu.toml"


def _hotter(old: Any, new: Any, ctx: PreviewContext) -> Preview:
    return Preview(lines=(f"Sampling temperature of new requests: {old:g} → {new:g}.",),
                   warnings=("hotter sampling: more diverse, less likely answers",) if new > old else ())


TEMPERATURE = Knob(
    "rollout_temperature", float, 0.1, 2.0, 1.0, TRAINER, followers=(ROLLOUTER,), boundary="step",
    applies="at the trainer's next local-step boundary", description="sampling temperature of new requests",
    state_path=("rollout", "temperature"), preview=_hotter, key="e", key_label="Temperature",
    title="Temperature (sampling, new requests)",
)


@pytest.fixture()
def temperature(monkeypatch: pytest.MonkeyPatch) -> Knob:
    monkeypatch.setitem(KNOBS, TEMPERATURE.name, TEMPERATURE)
    return TEMPERATURE


def test_an_added_knob_is_listed_validated_and_set_by_ctl_and_routed_by_the_table(
    temperature: Knob, monkeypatch: pytest.MonkeyPatch
) -> None:
    cli = CliRunner()
    help_text = cli.invoke(cli_app, ["ctl", "tiny", "set", "--help"], env={"COLUMNS": "200"}).output
    assert "rollout_temperature: a number in [0.1, 2], sampling temperature of new requests" in help_text
    assert "One of: trigger_parameter_sync_step | staleness_threshold | paused | rollout_temperature." in help_text

    core = ControllerCore("tiny", sinks=[])  # a real controller, in-process: `ctl` reaches it instead of over Ray
    monkeypatch.setattr("engine.control.client.ControlClient", lambda run, address: LocalSource(core, "op@test"))
    bad = cli.invoke(cli_app, ["ctl", "tiny", "set", "rollout_temperature", "5"])
    assert bad.exit_code == 1 and "rollout_temperature=5 is out of range" in bad.output
    ok = cli.invoke(cli_app, ["ctl", "tiny", "set", "rollout_temperature", "1.5", "--expect-version", "0"])
    assert ok.exit_code == 0, ok.output
    view = core.get_knobs()["rollout_temperature"]
    assert (view["value"], view["version"], view["pending"], view["consumer"]) == (1.5, 1, True, TRAINER)

    # the owner gets the change once; the follower only the applied value, once the owner acknowledged it
    assert KnobInbox(TRAINER).take(core.get_knobs()) == [KnobChange("rollout_temperature", 1.5, 1, True)]
    follower = KnobInbox(ROLLOUTER)
    assert [k for k in follower.take(core.get_knobs()) if k.name == "rollout_temperature"] == []
    core.ack_knob("rollout_temperature", 1, 7)
    assert follower.take(core.get_knobs()) == [KnobChange("rollout_temperature", 1.5, 1, False)]


async def test_an_added_knob_gets_a_dashboard_key_help_row_palette_entry_and_preview(temperature: Knob) -> None:
    from asyncrl_cli.tui import make_app
    from asyncrl_cli.tui.commands import palette_commands
    from asyncrl_cli.tui.screens.confirm import ConfirmScreen
    from asyncrl_cli.tui.screens.help import help_markdown

    core = live_core()
    async with make_app(LocalSource(core, who="operator@test"), poll_interval=0.05).run_test(size=SIZE) as pilot:
        app = pilot.app
        await wait_until(pilot, lambda: app.model.received)
        assert app.screen.active_bindings["e"].binding.description == "Temperature"
        names = [name for name, _, _ in palette_commands(app)]
        assert "Set temperature…" in names
        await open_knob_input(pilot, "e")
        assert str(app.screen.query_one("#knob-title").content) == TEMPERATURE.title
        await pilot.press("1", ".", "5", "enter")
        await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        body = str(app.screen.query_one("#confirm-body").content)
        assert "rollout_temperature: 1 → 1.5" in body and "Sampling temperature of new requests: 1 → 1.5." in body
        await answer_confirmation(pilot, "y")
        await wait_until(pilot, lambda: core.get_knobs()["rollout_temperature"]["value"] == 1.5)
    help_text = help_markdown(read_only=False)
    assert "| `e` | change the temperature (`rollout_temperature`) — validated, then confirmed |" in help_text
    assert "**rollout_temperature** (a number in [0.1, 2]): sampling temperature of new requests" in help_text
    assert "rollout_temperature" not in help_markdown(read_only=True)


def _resumed_core(tmp_path: Path, state: dict[str, Any], *sets: str) -> ControllerCore:
    """The driver's resume path: the checkpoint found on disk seeds the controller's knob table."""
    from engine.persist.checkpoint import ledger_position, write_checkpoint
    from engine.persist.resume import config_fingerprint, find_resume_point

    run_dir = tmp_path / "run"
    run_dir.mkdir(exist_ok=True)
    cfg = load_run_config(TINY, [f'logging.run_dir="{run_dir}"', *sets]).config
    assert cfg is not None
    full = {"step": 4, "version": 2, "since_sync": 0, "reason": "periodic", "run_dir": str(run_dir),
            "fingerprint": config_fingerprint(cfg), **ledger_position(run_dir / "ledger.jsonl"), **state}
    write_checkpoint(run_dir / "checkpoints", 4, save_trainer=None, state=full, queued=[], in_flight=[], keep_last=2)
    point = find_resume_point(cfg, "auto")
    assert point is not None
    config = cfg.model_dump()
    return ControllerCore(cfg.name, config=config, sinks=[], resumed_knobs=knobs_at_checkpoint(point.state, config))


def test_resume_starts_an_added_knob_and_the_built_in_ones_from_the_checkpoint(tmp_path: Path, temperature: Knob) -> None:
    state = {"trigger": 3, "rollout": {"temperature": 0.7, "staleness_threshold": 2.0}}
    knobs = _resumed_core(tmp_path, state, "async_training.trigger_parameter_sync_step=1").get_knobs()
    assert knobs["rollout_temperature"]["value"] == knobs["rollout_temperature"]["applied_value"] == 0.7
    assert knobs["trigger_parameter_sync_step"]["value"] == 3  # the live change before the checkpoint, not the file's 1
    assert knobs["staleness_threshold"]["value"] == 2.0
    assert all(k["version"] == 0 and not k["pending"] for k in knobs.values())  # in force, nothing to apply again


def test_in_sync_mode_resume_keeps_the_staleness_the_mode_forces(tmp_path: Path) -> None:
    state = {"trigger": 3, "rollout": {"staleness_threshold": 2.0}}
    knobs = _resumed_core(tmp_path, state, 'async_training.mode="sync"',
                          "async_training.staleness_threshold=0.5").get_knobs()
    assert knobs["trigger_parameter_sync_step"]["value"] == 3
    assert knobs["staleness_threshold"]["value"] == 0.5  # refused in sync mode: the checkpoint's value is not taken
