"""The `asyncrl` command line: one Typer app, one module per verb under `commands/`.

Exit codes: 0 ok · 1 invalid/failure · 2 usage · 3 does not fit · 130 interrupted. Nothing here imports
torch, ray, vllm or transformers: the engine is imported lazily by `launch` and `data make` only.
"""

from __future__ import annotations

import importlib
from typing import Annotated, Any

import typer

from asyncrl_cli.commands import data, import_, init, launch, presets, schema, validate
from asyncrl_cli.errors import AsyncrlError, debug_enabled, handle_errors, report_error

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
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"asyncrl {version('asyncrl')}")
        except PackageNotFoundError:
            typer.echo("asyncrl (not installed)")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """asyncrl: fully asynchronous GRPO/PPO with verl's semantics, on one CPU or many GPUs."""


app.command("init", rich_help_panel=LIFECYCLE)(init.command)
app.command("validate", rich_help_panel=LIFECYCLE)(validate.command)
app.command("launch", rich_help_panel=LIFECYCLE)(launch.command)
app.add_typer(presets.app, name="presets", rich_help_panel=INSPECT)
app.command("schema", rich_help_panel=INSPECT)(schema.command)
app.add_typer(import_.app, name="import", rich_help_panel=TOOLS)
app.add_typer(data.app, name="data", rich_help_panel=TOOLS)


def _unavailable(name: str, err: BaseException) -> Any:
    @handle_errors
    def command() -> None:
        raise AsyncrlError(f"`asyncrl {name}` is unavailable: {err}")

    command.__doc__ = f"(unavailable: {err})"
    return command


def _register_optional() -> None:
    """`attach`, `ctl`, `status` live in modules written separately; the CLI works without them."""
    specs = (("attach", "command", LIFECYCLE), ("ctl", "app", LIFECYCLE), ("status", "command", INSPECT))
    for name, attr, panel in specs:
        module_name = f"asyncrl_cli.commands.{name}"
        try:
            module = importlib.import_module(module_name)
            target = getattr(module, attr)
        except ModuleNotFoundError as e:
            if e.name == module_name:
                continue  # not written yet
            if debug_enabled():
                raise
            app.command(name, rich_help_panel=panel)(_unavailable(name, e))
            continue
        except Exception as e:  # noqa: BLE001 - a broken optional module must not break the CLI
            if debug_enabled():
                raise
            app.command(name, rich_help_panel=panel)(_unavailable(name, e))
            continue
        if attr == "app":
            app.add_typer(target, name=name, rich_help_panel=panel)
        else:
            app.command(name, rich_help_panel=panel)(target)


_register_optional()


def main() -> None:
    """Console-script entry; unexpected errors become one line (ASYNCRL_DEBUG=1 shows the trace)."""
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
