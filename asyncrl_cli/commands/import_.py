"""`asyncrl import verl SCRIPT.sh -o FILE`: convert a verl fully-async launch script into a run file."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from asyncrl_cli.errors import UsageProblem, handle_errors
from asyncrl_cli.output import stdout_console

app = typer.Typer(no_args_is_help=True, help="Convert other frameworks' run scripts into asyncrl run files.")


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
    """Map the Hydra overrides (DATA_CONFIG … ASYNC_CONFIG blocks, n_gpus_* / n_nodes_* variables) to
    asyncrl keys and list [bold]every[/] override that could not be mapped."""
    from asyncrl_cli.config.hardware import HardwareNotFound, load_hardware
    from asyncrl_cli.config.loader import analyze_run_config
    from asyncrl_cli.report import render_headline, render_problems
    from asyncrl_cli.verl_import.convert import convert_script
    from asyncrl_cli.verl_import.write import guess_hardware, render

    if not script.is_file():
        raise UsageProblem(f"script not found: {script}")
    if output.exists() and not force:
        raise UsageProblem(f"{output} exists", "pass --force to overwrite it")
    conv = convert_script(script.read_text(encoding="utf-8"))
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
    con = stdout_console()
    con.print(
        f"wrote {escape(str(output))}: {len(conv.values)} keys mapped, {len(conv.unmapped)} overrides "
        f"not mapped, {len(conv.consumed)} not needed"
    )
    for n in conv.notes:
        con.print(f"[cyan]note[/]  {escape(n)}")
    if note:
        con.print(f"[cyan]note[/]  {escape(note)}")
    for ov, why in conv.unmapped:
        con.print(f"[yellow]not mapped[/]  {escape(ov)}  [dim]({escape(why)})[/]")
    an = analyze_run_config(output)
    render_headline(con, an)
    render_problems(con, [p for p in an.problems if p.severity != "info"])
    raise typer.Exit(an.exit_code)
