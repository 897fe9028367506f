"""`asyncrl data make NAME --out DIR`: write a built-in dataset as verl-format parquet files.
`asyncrl data prepare geo3k --from DIR --out DIR`: convert a local copy of a public dataset to verl's layout."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import typer

from engine.config.names import BUILTIN_DATASETS
from asyncrl_cli.errors import AsyncrlError, UsageProblem, handle_errors
from asyncrl_cli.output import emit_json, stdout_console

app = typer.Typer(no_args_is_help=True,
                  help="Built-in datasets (copy, reverse, arith, figures) and local public datasets as parquet.")
PREPARABLE = ("geo3k",)
"""Public datasets `prepare` converts from a local copy."""


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
    try:
        from engine.data.builtin import ALL_TASKS, write_dataset
    except ImportError as e:
        raise AsyncrlError(f"the engine's dataset writer cannot be imported: {e}") from None
    if name not in ALL_TASKS:
        raise UsageProblem(f"unknown built-in dataset {name!r}", f"choose one of {', '.join(ALL_TASKS)}")
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


@app.command("prepare")
@handle_errors
def prepare(
    name: Annotated[str, typer.Argument(help=f"One of {', '.join(PREPARABLE)}.")],
    source: Annotated[
        Path, typer.Option("--from", help="Local copy of the dataset (e.g. a download of hiyouga/geometry3k).")
    ],
    out: Annotated[
        Path, typer.Option("--out", "-o", help="Directory for {split}.parquet (the geo3k preset reads ~/data/geo3k).")
    ] = Path("~/data/geo3k"),
    json_: Annotated[bool, typer.Option("--json", help="Print the per-split report as JSON.")] = False,
) -> None:
    """Convert a local copy of a public dataset into verl-format parquet files, one per split found."""
    if name not in PREPARABLE:
        raise UsageProblem(f"cannot prepare {name!r}", f"choose one of {', '.join(PREPARABLE)}")
    try:
        from engine.data.geo3k import prepare_geo3k
        from engine.data.parquet import DataError
    except ImportError as e:
        raise AsyncrlError(f"the engine's dataset converter cannot be imported: {e}") from None
    try:
        report = prepare_geo3k(source, out)
    except DataError as e:
        raise AsyncrlError(str(e)) from None
    except OSError as e:
        raise AsyncrlError(f"cannot convert {source} into {out}: {e}") from None
    if json_:
        emit_json(report)
        return
    con = stdout_console()
    for split, info in report.items():
        skipped = info["skipped_bad_image"] + info["skipped_image_mismatch"]
        note = (f" (skipped {info['skipped_bad_image']} with bad images, {info['skipped_image_mismatch']} whose "
                "<image> markers do not match their images)") if skipped else ""
        con.print(f"{split}: {info['path']}  {info['rows']} rows{note}")
