"""`asyncrl attach [RUN] [--address ADDR] [--read-only] [--replay RUN_DIR] [--json [--once]]`.

Opens the live dashboard on a run (RUN: an id, a name or a unique id prefix, resolved through the registry
of live runs on this machine and reached at that run's own Ray address, or with `--address` on that
cluster; omitted: the only live run), or replays a run directory. `--json --once` prints one snapshot for
scripts; `--json` alone prints one JSON line per poll (the new records and events since the previous line)
until the run ends. `q` in the dashboard detaches:
the run goes on.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from asyncrl_cli.commands._common import ReplayOpt, RunAddressOpt
from asyncrl_cli.commands._control import command_connection, control_errors
from asyncrl_cli.errors import UsageProblem, handle_errors
from asyncrl_cli.output import emit_json, stderr_console

TERMINAL_STATES = ("finished", "failed", "stopped")


def _stream_json(source: Any, interval: float) -> None:
    """One compact JSON line per poll until the run reaches a terminal state (or Ctrl-C)."""
    cursor = 0
    try:
        while True:
            with control_errors():
                snap = source.snapshot(cursor)
            cursor = int(snap.get("cursor", cursor))
            sys.stdout.write(json.dumps(snap, separators=(",", ":"), default=str) + "\n")
            sys.stdout.flush()
            if snap.get("state") in TERMINAL_STATES:
                return
            time.sleep(interval)
    except KeyboardInterrupt:
        return


def _check_usage(
    run: str | None, address: str | None, replay: Path | None, as_json: bool, once: bool
) -> None:
    if replay is not None and (run or address):
        raise UsageProblem("--replay reads a run directory: do not also pass RUN or --address")
    if once and not as_json:
        raise UsageProblem("--once prints one JSON snapshot: use it with --json")
    if not as_json and not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise UsageProblem(
            "the dashboard needs an interactive terminal",
            hint="use `asyncrl attach RUN --json --once` (or `asyncrl status RUN`) in scripts",
        )


@handle_errors
def command(
    run: Annotated[
        str | None,
        typer.Argument(help="Run id, name or unique id prefix; omit when exactly one run is live."),
    ] = None,
    address: RunAddressOpt = None,
    read_only: Annotated[
        bool, typer.Option("--read-only", help="Watch only: no knob, pause, checkpoint or stop action is available.")
    ] = False,
    replay: ReplayOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print snapshots as JSON instead of the dashboard.")] = False,
    once: Annotated[bool, typer.Option("--once", help="With --json: print one snapshot and exit.")] = False,
    interval: Annotated[float, typer.Option("--interval", min=0.1, help="Seconds between polls.")] = 1.0,
) -> None:
    """Attach the dashboard to a live run, or replay a finished one."""
    _check_usage(run, address, replay, as_json, once)
    with command_connection():
        _attach(run, address, replay, read_only, as_json, once, interval)


def _attach(
    run: str | None, address: str | None, replay: Path | None, read_only: bool, as_json: bool, once: bool,
    interval: float,
) -> None:
    from engine.control.client import open_source

    with control_errors():
        source = open_source(run, address, str(replay) if replay is not None else None, read_only)
    if as_json and once:
        with control_errors():
            emit_json(source.snapshot(0))
        return
    if as_json:
        _stream_json(source, interval)
        return
    from asyncrl_cli.tui import run_dashboard

    run_dashboard(source, read_only=read_only, poll_interval=interval)
    if replay is None:
        inner = getattr(source, "inner", source)
        name = getattr(inner, "run_id", None) or getattr(inner, "run_name", None) or run
        again = f"asyncrl attach {name}" + (f" --address {address}" if address else "")
        stderr_console().print(f"detached from {name!r}; it keeps running (re-attach: {again})")
