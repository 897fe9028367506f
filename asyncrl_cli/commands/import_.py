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


def row_adapter_problem(spec: str) -> str | None:
    """Why `--row-adapter` cannot name a row adapter, found without running the user's file: not
    `file.py:fn`, no such file (relative to the working directory, as in a run), not Python that parses, or no
    top-level plain function `fn` (a `def`, or a name an assignment or import binds); else None."""
    import ast

    from engine.data.row_adapter import SIGNATURE, SPEC, spec_problem

    problem = spec_problem(spec)
    if problem is not None:
        return problem.replace("data.row_adapter", "--row-adapter", 1)
    match = SPEC.match(spec)
    assert match is not None
    path, name = Path(match["file"]).expanduser(), match["fn"]
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError) as e:
        return f"--row-adapter {spec!r}: cannot read {path} as Python ({type(e).__name__}: {e})"
    stack, bound = list(tree.body), False
    while stack:
        node = stack.pop()
        if isinstance(node, ast.AsyncFunctionDef) and node.name == name:
            return f"--row-adapter {spec!r}: {name} is an async def; the adapter is a plain function ({SIGNATURE})"
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return None
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            bound |= any(isinstance(t, ast.Name) and t.id == name for t in targets)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= any((a.asname or a.name.split(".")[0]) == name for a in node.names)
        elif isinstance(node, (ast.If, ast.Try, ast.With)):  # definitions under a guard still run at import
            stack += [*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", []),
                      *(s for h in getattr(node, "handlers", []) for s in h.body)]
    if bound:
        return None
    return f"--row-adapter {spec!r}: {path} defines no function {name!r} at its top level ({SIGNATURE})"


@app.command("verl")
@handle_errors
def verl(
    script: Annotated[Path, typer.Argument(metavar="SCRIPT.sh", help="A verl fully-async launch script.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Run file to write.")],
    hardware: Annotated[
        str | None, typer.Option("--hardware", help="Hardware preset (default: guessed).")
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing file.")] = False,
    row_adapter: Annotated[str | None, typer.Option(
        "--row-adapter", metavar="FILE.py:FN",
        help="Your plain-Python row adapter (def fn(row: dict) -> dict) that replaces the script's verl dataset "
             "class (data.custom_cls), as data.row_adapter.")] = None,
    rollout_engine: Annotated[str | None, typer.Option(
        "--rollout-engine", metavar="vllm",
        help="Run a TensorRT-LLM or SGLang script on vLLM instead (your consent: the sampling is the script's, "
             "the engine's kernels and numerics are vLLM's; written into the file and printed as a warning).")
    ] = None,
) -> None:
    """Convert a verl fully-async script: every override is mapped (verl's value; verl's defaults filled where asyncrl's differ), ignored with its reason (no effect on the experiment), or an error.

    Two refusals lift with your consent, written into the file: --row-adapter FILE.py:FN replaces verl's dataset class (data.custom_cls) with your plain-Python row adapter; --rollout-engine vllm runs a TensorRT-LLM or SGLang script on vLLM (what may differ is printed as a warning).

    Exit codes: 0 written and valid · 1 not converted (every override asyncrl cannot honour is listed; nothing is written) or the written file is invalid · 2 usage (no script, output exists, unknown hardware, a --row-adapter file without the function, another --rollout-engine) · 3 written, but it does not fit the hardware."""  # noqa: E501
    from engine.plan.hardware import HardwareNotFound, load_hardware
    from asyncrl_cli.config.loader import analyze_run_config
    from asyncrl_cli.report import render_headline, render_problems
    from asyncrl_cli.verl_import.convert import convert_script
    from asyncrl_cli.verl_import.engines import SUBSTITUTES
    from asyncrl_cli.verl_import.write import guess_hardware, render

    if not script.is_file():
        raise UsageProblem(f"script not found: {script}")
    if output.exists() and not force:
        raise UsageProblem(f"{output} exists", "pass --force to overwrite it")
    if rollout_engine is not None and rollout_engine not in SUBSTITUTES:
        raise UsageProblem(f"--rollout-engine {rollout_engine}: asyncrl runs {' or '.join(SUBSTITUTES)} in place of "
                           "a TensorRT-LLM or SGLang rollout")
    if row_adapter is not None and (problem := row_adapter_problem(row_adapter)) is not None:
        raise UsageProblem(problem)
    conv = convert_script(read_script(script), row_adapter=row_adapter, rollout_engine=rollout_engine)
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
    for w in conv.warnings:
        con.print(f"[yellow]warning[/]  {escape(w)}")
    an = analyze_run_config(output)
    render_headline(con, an)
    render_problems(con, [p for p in an.problems if p.severity != "info"])
    raise typer.Exit(an.exit_code)
