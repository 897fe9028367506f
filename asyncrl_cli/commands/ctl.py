"""`asyncrl ctl RUN set KNOB VALUE | pause | resume | checkpoint | stop` — change a live run without the TUI.

Every change is compare-and-set on the controller (pass `--expect-version N` to fail instead of
overwriting a change made after you looked), range-checked, and recorded in the run's `events.jsonl`
with who and when; the trainer/rollouter acknowledge it with the step at which it took effect.
"""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer

from asyncrl_cli.commands._control import control_errors
from asyncrl_cli.errors import AsyncrlError, UsageProblem, handle_errors
from asyncrl_cli.output import emit_json, stdout_console

app = typer.Typer(
    help="Change a live run: set a knob, pause/resume generation, checkpoint now, stop gracefully.",
    no_args_is_help=True,
)

AddressOpt = Annotated[
    str | None, typer.Option("--address", help="Ray cluster address (default: this machine).")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the controller's answer as JSON.")]


@app.callback()
def _run_argument(
    ctx: typer.Context,
    run: Annotated[str, typer.Argument(help="Run name (the controller's actor name).")],
    address: AddressOpt = None,
) -> None:
    """Select the run; the subcommand says what to change."""
    ctx.obj = {"run": run, "address": address}


def _client(ctx: typer.Context, address: str | None) -> Any:
    from engine.runtime.control_client import ControlClient

    return ControlClient(ctx.obj["run"], address or ctx.obj["address"])


def _report(what: str, result: dict[str, Any], as_json: bool) -> None:
    """Print the outcome; a refusal is an error (exit 1) carrying the controller's reason."""
    if as_json:
        emit_json({"request": what, **result})
    if not result.get("ok"):
        raise AsyncrlError(f"{what} rejected: {result.get('reason')}", exit_code=1)
    if not as_json:
        version = f" (knob version {result['version']})" if result.get("version") is not None else ""
        stdout_console().print(f"{what}: {result.get('reason')}{version}")


@app.command("set", context_settings={"ignore_unknown_options": True})
@handle_errors
def set_knob(
    ctx: typer.Context,
    knob: Annotated[str, typer.Argument(help="trigger_parameter_sync_step | staleness_threshold | paused")],
    value: Annotated[str, typer.Argument(help="New value (validated against the knob's range).")],
    expect_version: Annotated[
        int | None,
        typer.Option(
            "--expect-version", help="Only apply if the knob is still at this version (compare-and-set)."
        ),
    ] = None,
    address: AddressOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Set a knob; it shows as pending until the consumer applies it at its next boundary."""
    from engine.runtime.knobs import parse_knob_value

    with control_errors():
        parsed = parse_knob_value(knob, value)
        result = _client(ctx, address).set_knob(knob, parsed, expect_version)
    _report(f"{knob} → {value}", result, as_json)


def _set_paused(ctx: typer.Context, paused: bool, address: str | None, as_json: bool) -> None:
    with control_errors():
        result = _client(ctx, address).set_knob("paused", paused)
    _report("pause" if paused else "resume", result, as_json)


@app.command()
@handle_errors
def pause(ctx: typer.Context, address: AddressOpt = None, as_json: JsonOpt = False) -> None:
    """Pause generation (the trainer drains the queue, then waits)."""
    _set_paused(ctx, True, address, as_json)


@app.command()
@handle_errors
def resume(ctx: typer.Context, address: AddressOpt = None, as_json: JsonOpt = False) -> None:
    """Resume generation."""
    _set_paused(ctx, False, address, as_json)


@app.command()
@handle_errors
def checkpoint(ctx: typer.Context, address: AddressOpt = None, as_json: JsonOpt = False) -> None:
    """Write a checkpoint at the trainer's next local-step boundary."""
    with control_errors():
        result = _client(ctx, address).request_action("checkpoint")
    _report("checkpoint", result, as_json)


@app.command()
@handle_errors
def stop(
    ctx: typer.Context,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    address: AddressOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Stop the run gracefully: checkpoint and finish at the trainer's next local-step boundary."""
    if not yes:
        if not sys.stdin.isatty():
            raise UsageProblem("refusing to stop a run without confirmation", hint="pass --yes")
        typer.confirm(f"Stop run {ctx.obj['run']!r} for everyone?", abort=True)
    with control_errors():
        result = _client(ctx, address).request_action("stop")
    _report("stop", result, as_json)
