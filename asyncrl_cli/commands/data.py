"""`asyncrl data make NAME --out DIR`: write a built-in dataset as verl-format parquet files."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import typer

from asyncrl_cli.config.schema import BUILTIN_DATASETS
from asyncrl_cli.errors import AsyncrlError, UsageProblem, handle_errors
from asyncrl_cli.output import emit_json, stdout_console

app = typer.Typer(no_args_is_help=True, help="Built-in datasets (copy, reverse, arith) as parquet files.")


def _paths(result: Any) -> list[tuple[str, str]]:
    if isinstance(result, Mapping):
        return [(str(k), str(v)) for k, v in result.items()]
    if isinstance(result, (str, Path)):
        return [("file", str(result))]
    return [(f"file{i}", str(p)) for i, p in enumerate(result or [])]


@app.command("make")
@handle_errors
def make(
    name: Annotated[str, typer.Argument(help=f"One of {', '.join(BUILTIN_DATASETS)}.")],
    out: Annotated[
        Path, typer.Option("--out", "-o", help="Directory to write train/val parquet files into.")
    ],
    train_size: Annotated[
        int | None, typer.Option("--train-size", min=1, help="Training rows (default: the task's).")
    ] = None,
    val_size: Annotated[
        int | None, typer.Option("--val-size", min=1, help="Validation rows (default: the task's).")
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Generation seed.")] = 0,
    json_: Annotated[bool, typer.Option("--json", help="Print the written paths as JSON.")] = False,
) -> None:
    """Generate a built-in task deterministically from the seed and print the written paths."""
    if name not in BUILTIN_DATASETS:
        raise UsageProblem(
            f"unknown built-in dataset {name!r}", f"choose one of {', '.join(BUILTIN_DATASETS)}"
        )
    try:
        from engine.data.builtin import write_dataset
    except ImportError as e:
        raise AsyncrlError(f"the engine's dataset writer cannot be imported: {e}") from None
    try:
        result = write_dataset(name, out, seed=seed, train_size=train_size, val_size=val_size)
    except (OSError, ValueError) as e:
        raise AsyncrlError(f"cannot write {name} to {out}: {e}") from None
    paths = _paths(result)
    if json_:
        emit_json(dict(paths))
        return
    con = stdout_console()
    for split, path in paths:
        con.print(f"{split}: {path}")
