"""`asyncrl ctl RUN set KNOB VALUE | pause | resume | checkpoint | stop` — change a live run without the TUI.

RUN is a run id, a name, or a unique id prefix, resolved through the registry of live runs on this machine
(or, with `--address`, on that cluster); a name shared by several live runs is refused with the candidates.
Options may come before or after the sub-verb: `ctl RUN --address X set ...` = `ctl --address X RUN set ...`.

Every change is compare-and-set on the controller (pass `--expect-version N` to fail instead of
overwriting a change made after you looked), range-checked, and recorded in the run's `events.jsonl`
with who and when; the trainer/rollouter acknowledge it with the step at which it took effect.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Annotated, Any

import click
import typer
from typer.core import TyperGroup

from asyncrl_cli.commands._control import command_connection, control_errors
from asyncrl_cli.errors import AsyncrlError, UsageProblem, handle_errors
from asyncrl_cli.output import emit_json, stdout_console

VALUE_OPTIONS = {"--address", "--expect-version"}


def verb_first(args: list[str], verbs: Iterable[str]) -> list[str]:
    """Move the options written between RUN and the sub-verb to just after the sub-verb, where the
    sub-verb's parser reads them (`RUN --address X set K V` → `RUN set --address X K V`)."""
    verbs, i, n = set(verbs), 0, len(args)
    while i < n and args[i].startswith("-"):  # the group's own options before RUN
        i += 2 if args[i] in VALUE_OPTIONS else 1
    j = i + 1
    while j < n and args[j] not in verbs:
        j += 2 if args[j] in VALUE_OPTIONS else 1
    if j >= n or j == i + 1:
        return args
    return [*args[: i + 1], args[j], *args[i + 1 : j], *args[j + 1 :]]


def knob_help() -> str:
    """`ctl set`'s help: one line per knob of the table (`engine.control.knob_table.KNOBS`, read when help is shown)."""
    from engine.control.knob_table import KNOBS  # pure Python, no heavy import; read at call time, never cached

    lines = [f"{k.name}: {k.range_text()}, {k.description}; applies {k.applies}." for k in KNOBS.values()]
    return "Set a knob; it shows as pending until its owner applies it.\n\n" + "\n\n".join(lines)


def knob_names() -> list[str]:
    from engine.control.knob_table import KNOBS

    return list(KNOBS)


def _complete_knob(incomplete: str) -> list[str]:
    return [n for n in knob_names() if n.startswith(incomplete)]


class _RunThenVerb(TyperGroup):
    """`ctl`'s group: options are accepted before or after the sub-verb; `set`'s help lists the knob table."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, verb_first(list(args), self.commands))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        cmd = super().get_command(ctx, cmd_name)
        if cmd is not None and cmd_name == "set":  # the table as it is now: help text and the KNOB choices
            cmd.help = knob_help()
            for param in cmd.params:
                if param.name == "knob":
                    param.help = "One of: " + " | ".join(knob_names()) + "."
        return cmd


app = typer.Typer(
    cls=_RunThenVerb,
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
    run: Annotated[str, typer.Argument(help="Run id, name, or a unique id prefix.")],
    address: AddressOpt = None,
) -> None:
    """Select the run; the subcommand says what to change."""
    ctx.obj = {"run": run, "address": address}


def _client(ctx: typer.Context, address: str | None) -> Any:
    from engine.control.client import ControlClient

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
    knob: Annotated[str, typer.Argument(help="A live knob.", autocompletion=_complete_knob)],
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
    """Set a knob; it shows as pending until its owner applies it (the knobs: `knob_help`)."""
    from engine.control.knobs import parse_knob_value

    with command_connection(), control_errors():
        parsed = parse_knob_value(knob, value)
        result = _client(ctx, address).set_knob(knob, parsed, expect_version)
    _report(f"{knob} → {value}", result, as_json)


def _set_paused(ctx: typer.Context, paused: bool, address: str | None, as_json: bool) -> None:
    with command_connection(), control_errors():
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
    with command_connection(), control_errors():
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
    with command_connection(), control_errors():
        result = _client(ctx, address).request_action("stop")
    _report("stop", result, as_json)
