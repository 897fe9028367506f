"""`asyncrl presets list|show`: the shipped presets and verl's rollout-correction presets."""

from __future__ import annotations

import difflib
from typing import Annotated

import typer
from rich.markup import escape
from rich.syntax import Syntax
from rich.table import Table

from asyncrl_cli.commands._common import JsonOpt
from asyncrl_cli.config.catalog import KINDS, find_preset, list_presets, preset_names
from engine.config.rc_presets import RC_PRESETS, canonical_preset_name
from asyncrl_cli.errors import UsageProblem, handle_errors
from asyncrl_cli.output import emit_json, stdout_console

RC_KIND = "rollout-correction"

app = typer.Typer(no_args_is_help=True, help="List and show presets (runs, models, datasets, hardware).")


@app.command("list")
@handle_errors
def list_(
    kind: Annotated[
        str | None, typer.Argument(help=f"Only this kind: {', '.join(KINDS)} or {RC_KIND}.")
    ] = None,
    json_: JsonOpt = False,
) -> None:
    """List presets with their one-line descriptions."""
    if kind is not None and kind not in (*KINDS, RC_KIND):
        raise UsageProblem(f"unknown kind {kind!r}", f"choose one of {', '.join((*KINDS, RC_KIND))}")
    rows: list[tuple[str, str, str]] = []
    if kind != RC_KIND:
        for ref in list_presets(kind):
            rows.append((ref.kind, ref.name, ref.description()))
    if kind in (None, RC_KIND):
        for name, keys in RC_PRESETS.items():
            rows.append((RC_KIND, name, ", ".join(f"{k}={v}" for k, v in keys.items() if v is not None)))
    if json_:
        emit_json([{"kind": k, "name": n, "description": d} for k, n, d in rows])
        return
    t = Table(show_lines=False)
    t.add_column("kind")
    t.add_column("name", style="bold")
    t.add_column("description")
    for k, n, d in rows:
        t.add_row(k, n, escape(d))
    con = stdout_console()
    con.print(t)
    con.print(
        '[dim]use a preset with extends = ["kind/name"]; show one with `asyncrl presets show kind/name`[/]'
    )


@app.command("show")
@handle_errors
def show(
    name: Annotated[
        str, typer.Argument(help="kind/name or name, e.g. runs/tiny-cpu, h100, rollout-correction.")
    ],
) -> None:
    """Print a preset file (or the rollout-correction preset table)."""
    con = stdout_console()
    if name.startswith(RC_KIND):
        only = name.partition("/")[2]
        t = Table(title="algorithm.rollout_correction.preset (verl's RolloutCorrectionConfig presets)")
        t.add_column("preset", style="bold")
        t.add_column("keys it sets")
        for n, keys in RC_PRESETS.items():
            if only and canonical_preset_name(only) != n:
                continue
            t.add_row(n, ", ".join(f"{k} = {v!r}" for k, v in keys.items()))
        con.print(t)
        return
    matches = find_preset(name)
    if not matches:
        close = difflib.get_close_matches(
            name, preset_names() + [n.split("/")[1] for n in preset_names()], n=3
        )
        raise UsageProblem(
            f"unknown preset {name!r}",
            f"did you mean {', '.join(close)}?" if close else "see `asyncrl presets list`",
        )
    if len(matches) > 1:
        raise UsageProblem(f"{name!r} is ambiguous: {', '.join(m.ref for m in matches)}", "write kind/name")
    text = matches[0].path.read_text(encoding="utf-8")
    con.print(f"[dim]{escape(str(matches[0].path))}[/]")
    con.print(Syntax(text, "toml", theme="ansi_dark", background_color="default"))
