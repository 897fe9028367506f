"""`asyncrl tools try TOOL --args JSON` (or `--code FILE`): one tool call through exactly the run's sandbox.

The tools are the run's (`--config RUN.toml`, read and checked as `validate` does: built-ins named in
`[rollout.multi_turn]` or its verl `tool_config_path`) or, without a run file, the built-ins. The call runs in
the same box, with the same limits, as in a run (`engine.agent.sandbox.run_sandboxed`), or on the run's
SandboxFusion service when its verl config names one; a stateful verl-style class (a YAML `class_name` of
yours) runs as in a trajectory: one box, `create(**create_kwargs)`, `execute(args)`, `release`. Printed: the
answer, the status, the time, where it ran, the limit that stopped it (and a class's step reward).

Exit codes: 0 the call answered (`ok`) · 1 it ended in `error`, `timeout` or `limit`, or no sandbox can be
built here (the message says why and how to fix it) · 2 usage (unknown tool, bad JSON, arguments the tool's
schema refuses, a missing file).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer

from asyncrl_cli.commands._common import JsonOpt, SetOpt, analyze
from asyncrl_cli.errors import AsyncrlError, UsageProblem, handle_errors
from asyncrl_cli.output import emit_json, stdout_console

app = typer.Typer(no_args_is_help=True, help="Run and debug the multi-turn tools in their sandbox.")


def _registry(config: Path | None, sets: list[str] | None) -> tuple[Any, bool]:
    """The run's tools (or every built-in) and the run's `allow_unsandboxed`."""
    from engine.agent.tools import BUILTIN_TOOLS, ToolRegistry, run_tools

    if config is None:
        return ToolRegistry(list(BUILTIN_TOOLS.values())), False
    an = analyze(config, sets)
    if an.config is None:
        raise AsyncrlError(f"{config} is not a valid run file", f"run `asyncrl validate {config}` to see why")
    mt = an.config.rollout.multi_turn
    try:
        return run_tools(mt, config.resolve().parent), mt.allow_unsandboxed
    except (OSError, ValueError) as e:
        raise AsyncrlError(f"{config}: the run's tools cannot be loaded: {e}") from None


def _arguments(args: str | None, code: Path | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if args is not None:
        try:
            out = json.loads(args)
        except json.JSONDecodeError as e:
            raise UsageProblem(f"--args is not JSON: {e}", 'e.g. --args \'{"expression": "6*7"}\'') from None
        if not isinstance(out, dict):
            raise UsageProblem("--args must be a JSON object of the tool's arguments")
    if code is not None:
        if not code.is_file():
            raise UsageProblem(f"--code file not found: {code}")
        out["code"] = code.read_text(encoding="utf-8", errors="replace")
    return out


@app.command("try")
@handle_errors
def try_(
    tool: Annotated[str, typer.Argument(help="The tool: its config name (python, calculator, lookup) or the "
                                             "name the model calls (code_interpreter).")],
    args: Annotated[str | None, typer.Option("--args", help="The call's arguments as a JSON object.")] = None,
    code: Annotated[Path | None, typer.Option("--code", help="A Python file: the interpreter's `code` argument.")]
    = None,
    create_kwargs: Annotated[str | None, typer.Option(
        "--create-kwargs", help="A row's `tools_kwargs.TOOL.create_kwargs` (JSON): merged over the arguments after "
        "the schema check, as in a run (a verl-style class: passed to its `create`).")] = None,
    config: Annotated[Path | None, typer.Option("--config", "-c", metavar="RUN.toml",
                                                help="Take the tools and limits of this run file.")] = None,
    set_: SetOpt = None,
    timeout: Annotated[float | None, typer.Option("--timeout", min=0.1, help="Override the tool's timeout (s).")]
    = None,
    json_: JsonOpt = False,
) -> None:
    """Run one tool call in the run's sandbox and print its answer, status, time and the limit it hit.

    Exit codes: 0 answered · 1 error, timeout, limit, or no sandbox here · 2 usage.
    """
    from engine.agent.box import unavailable_reason
    from engine.agent.sandbox import run_sandboxed
    from engine.agent.tools import BUILTIN_TOOLS
    from engine.agent.tool_calls import ToolCall

    registry, allow_unsandboxed = _registry(config, set_)
    name = BUILTIN_TOOLS[tool].name if tool in BUILTIN_TOOLS and tool not in registry.tools else tool
    if name not in registry.tools:
        raise UsageProblem(f"no tool {tool!r} here", f"available: {', '.join(registry.tools)}")
    arguments = _arguments(args, code)
    problem = registry.check(ToolCall(name, arguments))
    if problem is not None:
        raise UsageProblem(problem, json.dumps(registry.tools[name].parameters))
    spec = registry.tools[name]
    hidden = _arguments(create_kwargs, None)
    arguments = arguments if spec.stateful else {**arguments, **hidden}
    reason = unavailable_reason() if spec.service is None else None
    if reason is not None and not allow_unsandboxed:
        raise AsyncrlError(f"tools refuse to run: {reason}")
    limits = spec.limits if timeout is None else replace(spec.limits, timeout_s=timeout)
    if spec.service is not None:
        from engine.agent.fusion import run_fusion

        out = run_fusion(spec.service, arguments.get("code", ""), limits)
        where = f"SandboxFusion at {spec.service.url}"
    elif spec.stateful:  # verl's create(**create_kwargs) → execute(arguments) → release, in one box
        from engine.agent.session import ToolSession

        session = ToolSession(("tools-try", 0, False), replace(spec, limits=limits), "box" if reason is None
                              else "none")
        out = session.call(arguments, {"create_kwargs": hidden})
        session.release("tools try is done")
        where = "bubblewrap, one instance" if reason is None else "NONE (allow_unsandboxed)"
    else:
        out = run_sandboxed(spec.function, arguments, limits, "box" if reason is None else "none")
        where = "bubblewrap" if reason is None else "NONE (allow_unsandboxed)"
    doc = {"tool": name, "status": out.status, "limit": out.limit, "seconds": round(out.seconds, 4),
           "sandbox": where, "answer": out.text, "reward": out.reward,
           "limits": {"timeout_s": limits.timeout_s, "memory_mb": limits.memory_mb,
                      "max_output_chars": limits.max_output_chars, "processes": limits.processes,
                      "file_mb": limits.file_mb, "open_files": limits.open_files}}
    if json_:
        emit_json(doc)
    else:
        con = stdout_console()
        con.print(out.text, markup=False, highlight=False)
        hit = (f" · limit hit: {out.limit}" if out.limit else "") + \
            (f" · step reward: {out.reward:g}" if out.reward is not None else "")
        con.print(f"[dim]{name}: {out.status} in {out.seconds * 1000:.0f} ms{hit} · sandbox: {doc['sandbox']} · "
                  f"limits: {limits.timeout_s:g} s, {limits.memory_mb} MiB, {limits.processes} processes, "
                  f"{limits.file_mb} MiB files, {limits.max_output_chars} chars[/]")
    raise typer.Exit(0 if out.ok else 1)
