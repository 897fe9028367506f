"""`asyncrl bench NAME`: run one benchmark study (or `all`, `list`, `report`) — a thin front for
`python -m benchmarks`. The benchmarks package lives at the repository root and is imported only when the
command runs, so `asyncrl --help` stays light.

The wheel does not ship it, on purpose: the studies are the project's own measurements (they rewrite
docs/benchmarks.md and need the bench extra), so they belong to a source checkout. Without one the command
fails with one line saying so (exit 1)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from asyncrl_cli.errors import AsyncrlError, handle_errors

_REPO = Path(__file__).resolve().parents[2]


def _benchmarks_main():
    try:
        from benchmarks.cli import main
    except ModuleNotFoundError as e:
        if e.name not in ("benchmarks", "benchmarks.cli") or not (_REPO / "benchmarks" / "cli.py").exists():
            raise
        sys.path.insert(0, str(_REPO))  # an editable install maps only asyncrl_cli/ and engine/
        from benchmarks.cli import main
    return main


@handle_errors
def command(
    name: Annotated[
        str,
        typer.Argument(
            metavar="NAME",
            help="async-vs-sync, rollout-throughput, weight-sync, "
            "trainer-throughput, cli-latency, staleness, all, list or report.",
        ),
    ],
    toy: Annotated[bool, typer.Option("--toy", help="The seconds-long toy size (smoke test).")] = False,
    out: Annotated[Path | None, typer.Option("--out", help="Results directory.")] = None,
    max_load: Annotated[
        float | None,
        typer.Option("--max-load", help="Wait for the 1-minute load average to drop below this first."),
    ] = None,
    wait: Annotated[float, typer.Option("--wait", help="Longest wait for --max-load, in seconds.")] = 600.0,
) -> None:
    """Run a benchmark study and write its JSON results and plot (see docs/benchmarks.md)."""
    try:
        main = _benchmarks_main()
    except ModuleNotFoundError as e:
        raise AsyncrlError(
            "asyncrl bench needs the benchmarks/ folder of a source checkout, which this install lacks "
            f"(no module {e.name!r})",
            "clone the asyncrl repository and run `asyncrl bench` (or `python -m benchmarks`) from it",
        ) from None
    argv = [
        name,
        *(["--toy"] if toy else []),
        *(["--out", str(out)] if out else []),
        *(["--max-load", str(max_load), "--wait", str(wait)] if max_load is not None else []),
    ]
    raise typer.Exit(main(argv))
