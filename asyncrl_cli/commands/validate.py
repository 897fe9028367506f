"""`asyncrl validate RUN.toml…`: schema, cross-field rules, resource and memory fit, pitfalls, paths."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from asyncrl_cli.commands._common import JsonOpt, SetOpt, analyze
from asyncrl_cli.config.problems import EXIT_DOES_NOT_FIT, EXIT_INVALID, EXIT_OK
from asyncrl_cli.errors import handle_errors
from asyncrl_cli.output import emit_json, stdout_console
from asyncrl_cli.report import (
    render_derived,
    render_fit,
    render_memory_terms,
    render_headline,
    render_model,
    render_problems,
    render_provenance,
)


def worst_exit(codes: list[int]) -> int:
    """Invalid (1) beats does-not-fit (3) beats ok (0)."""
    if EXIT_INVALID in codes:
        return EXIT_INVALID
    if EXIT_DOES_NOT_FIT in codes:
        return EXIT_DOES_NOT_FIT
    return EXIT_OK


@handle_errors
def command(
    run_files: Annotated[list[Path], typer.Argument(metavar="RUN.toml", help="Run files to check.")],
    set_: SetOpt = None,
    explain: Annotated[
        bool, typer.Option("--explain", help="Show which file, line or flag set each key, and each role's "
                           "predicted peak memory term by term.")
    ] = False,
    json_: JsonOpt = False,
) -> None:
    """Check run files and report [bold]every[/] problem at once, with file:line and key.

    Exit codes: 0 valid · 1 invalid · 2 usage · 3 does not fit the hardware.
    """
    analyses = [analyze(p, set_) for p in run_files]
    code = worst_exit([a.exit_code for a in analyses])
    if json_:
        docs = []
        for a in analyses:
            doc = a.to_json()
            if explain:
                doc["provenance"] = a.provenance.to_json()
            docs.append(doc)
        emit_json(docs[0] if len(docs) == 1 else {"exit_code": code, "files": docs})
        raise typer.Exit(code)
    con = stdout_console()
    for i, a in enumerate(analyses):
        if i:
            con.print()
        render_headline(con, a)
        render_problems(con, a.problems)
        if len(analyses) == 1 or explain:
            render_model(con, a)
            render_derived(con, a)
            render_fit(con, a)
        if explain:
            render_memory_terms(con, a)
            render_provenance(con, a)
    raise typer.Exit(code)
