"""`asyncrl import verl SCRIPT.sh -o FILE`: convert a verl fully-async launch script into a run file."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from asyncrl_cli.errors import InvalidConfig, UsageProblem, handle_errors
from asyncrl_cli.output import stderr_console, stdout_console

app = typer.Typer(no_args_is_help=True, help="Convert other frameworks' run scripts into asyncrl run files.")


def read_script(path: Path) -> str:
    """The script's text, or an InvalidConfig naming what it is instead (empty, binary, not UTF-8, unreadable)."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise InvalidConfig(f"{path}: cannot read it ({e.strerror or e})") from None
    if not data.strip():
        raise InvalidConfig(f"{path}: the script is empty: nothing to convert")
    if b"\x00" in data:
        raise InvalidConfig(f"{path}: a binary file (it has NUL bytes), not a shell script")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidConfig(f"{path}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}); "
                            "save the script as UTF-8") from None


@app.command("verl")
@handle_errors
def verl(
    script: Annotated[Path, typer.Argument(metavar="SCRIPT.sh", help="A verl fully-async launch script.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Run file to write.")],
    hardware: Annotated[
        str | None, typer.Option("--hardware", help="Hardware preset (default: guessed).")
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing file.")] = False,
) -> None:
    """Convert a verl fully-async script: every override is mapped (verl's value; verl's defaults filled where asyncrl's differ), ignored with its reason (no effect on the experiment), or an error.

    Exit codes: 0 written and valid · 1 not converted (every override asyncrl cannot honour is listed; nothing is written) or the written file is invalid · 2 usage (no script, output exists, unknown hardware) · 3 written, but it does not fit the hardware."""  # noqa: E501
    from engine.plan.hardware import HardwareNotFound, load_hardware
    from asyncrl_cli.config.loader import analyze_run_config
    from asyncrl_cli.report import render_headline, render_problems
    from asyncrl_cli.verl_import.convert import convert_script
    from asyncrl_cli.verl_import.write import guess_hardware, render

    if not script.is_file():
        raise UsageProblem(f"script not found: {script}")
    if output.exists() and not force:
        raise UsageProblem(f"{output} exists", "pass --force to overwrite it")
    conv = convert_script(read_script(script))
    if not conv.found_launch:
        raise InvalidConfig(f"{script}: no verl launch command (`python3 -m verl…main` with key=value overrides) "
                            "in the script: nothing to convert")
    con = stdout_console()
    for n in conv.notes:
        con.print(f"[cyan]note[/]  {escape(n)}")
    if conv.errors:
        err = stderr_console()
        err.print(f"[red]not converted[/]: {len(conv.errors)} override(s) of {escape(script.name)} change the "
                  "experiment in a way asyncrl cannot honour; nothing was written")
        for ov, why in conv.errors:
            err.print(f"[red]error[/]  {escape(ov)}  [dim]({escape(why)})[/]")
        raise typer.Exit(1)
    note = None
    if hardware is None:
        hardware = guess_hardware(conv, script.name)
        note = f"hardware guessed as {hardware!r}; pass --hardware to choose"
    try:
        load_hardware(hardware)
    except HardwareNotFound as e:
        raise UsageProblem(str(e)) from None
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(render(conv, script, output, hardware, note), encoding="utf-8")
    con.print(f"wrote {escape(str(output))}: {len(conv.values)} keys mapped, {len(conv.ignored)} overrides "
              "ignored (no effect on the experiment; listed in the file)")
    if note:
        con.print(f"[cyan]note[/]  {escape(note)}")
    an = analyze_run_config(output)
    render_headline(con, an)
    render_problems(con, [p for p in an.problems if p.severity != "info"])
    raise typer.Exit(an.exit_code)
