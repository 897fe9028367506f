"""Options and helpers shared by the commands that read a run file."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from asyncrl_cli.errors import UsageProblem

if TYPE_CHECKING:
    from asyncrl_cli.config.loader import Analysis

SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        "-s",
        metavar="KEY=VALUE",
        help="Override one key, e.g. [bold]--set trainer.optim.lr=1e-5[/] (value read as a TOML literal; "
        "repeatable; applied after every file).",
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout instead of tables.")]

# The options of the commands that read a live run (`attach`, `status`; `ctl` spells its own RUN argument).
RunAddressOpt = Annotated[
    str | None,
    typer.Option("--address", help="Ray cluster address (default: the run's own, from this machine's registry)."),
]
ReplayOpt = Annotated[
    Path | None,
    typer.Option("--replay", help="Read a run directory (metrics.jsonl, events.jsonl, config.resolved.json) "
                 "instead of a live run."),
]


def analyze(path: Path, sets: list[str] | None) -> Analysis:
    """Load and check a run file; a missing file or a malformed --set is a usage error (exit 2)."""
    if not path.is_file():
        raise UsageProblem(f"run file not found: {path}", "pass a TOML file, e.g. presets/runs/tiny-cpu.toml")
    from asyncrl_cli.config.layering import OverrideError
    from asyncrl_cli.config.loader import analyze_run_config

    try:
        return analyze_run_config(path, sets or [])
    except OverrideError as e:
        raise UsageProblem(str(e)) from None
