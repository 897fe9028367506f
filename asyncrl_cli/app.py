"""The `asyncrl` command line: one Typer app, one module per verb under `commands/`.

Exit codes: 0 ok · 1 invalid/failure · 2 usage · 3 does not fit · 4 no cluster / no such run · 130 interrupted. Nothing here imports
torch, ray, vllm or transformers: the engine is imported lazily by `launch` and `data make` only.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from asyncrl_cli.commands import (
    attach, bench, ctl, data, import_, init, launch, plan, presets, rehearse, schema, simulate, status, tools,
    validate,
)
from asyncrl_cli.errors import AsyncrlError, debug_enabled, report_error
from asyncrl_cli.version import VERSION_FLAGS, version_line

LIFECYCLE = "Run lifecycle"
INSPECT = "Inspect"
TOOLS = "Tools"

app = typer.Typer(
    name="asyncrl",
    help="Fully asynchronous RL post-training of LLMs: validate, launch and watch runs described in TOML.",
    no_args_is_help=True,
    rich_markup_mode="rich",
    pretty_exceptions_show_locals=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(version_line())
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option(*VERSION_FLAGS, callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """asyncrl: fully asynchronous GRPO/PPO with verl's semantics, on one CPU or many GPUs."""


app.command("init", rich_help_panel=LIFECYCLE)(init.command)
app.command("validate", rich_help_panel=LIFECYCLE)(validate.command)
app.command("launch", rich_help_panel=LIFECYCLE)(launch.command)
app.command("attach", rich_help_panel=LIFECYCLE)(attach.command)
app.add_typer(ctl.app, name="ctl", rich_help_panel=LIFECYCLE)
app.command("status", rich_help_panel=INSPECT)(status.command)
app.add_typer(presets.app, name="presets", rich_help_panel=INSPECT)
app.command("schema", rich_help_panel=INSPECT)(schema.command)
app.add_typer(import_.app, name="import", rich_help_panel=TOOLS)
app.add_typer(data.app, name="data", rich_help_panel=TOOLS)
app.command("bench", rich_help_panel=TOOLS)(bench.command)
app.command("simulate", rich_help_panel=TOOLS)(simulate.command)
app.command("plan", rich_help_panel=TOOLS)(plan.command)
app.command("rehearse", rich_help_panel=TOOLS)(rehearse.command)
app.add_typer(tools.app, name="tools", rich_help_panel=TOOLS)


def main() -> None:
    """Console-script entry; unexpected errors become one line (ASYNCRL_DEBUG=1 shows the trace)."""
    if len(sys.argv) == 2 and sys.argv[1] in VERSION_FLAGS:  # `asyncrl -V`: answered before Click builds the tree
        print(version_line())
        raise SystemExit(0)
    try:
        app()
    except AsyncrlError as e:
        report_error(e)
        raise SystemExit(e.exit_code) from None
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    except Exception as e:  # noqa: BLE001 - the last line of defence: never a traceback for users
        if debug_enabled():
            raise
        report_error(
            AsyncrlError(
                f"internal error: {type(e).__name__}: {e}",
                "set ASYNCRL_DEBUG=1 to see the traceback, and please report it",
            )
        )
        raise SystemExit(1) from None
