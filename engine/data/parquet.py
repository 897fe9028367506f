"""Read verl-format parquet datasets into `DataRow`s, with errors that name the file, row and column.

verl's layout (one row per prompt): `prompt` (list of chat messages `{"role", "content"}`; a plain string is
accepted and used verbatim), `data_source: str`, `reward_model: {"style", "ground_truth"}`, `extra_info:
dict` (optional), `ability: str` (optional). The prompt column's name is configurable (`data.prompt_key`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Messages = list[dict[str, str]]


class DataError(ValueError):
    """A dataset that cannot be used; the message names the file (and row/column when relevant)."""


@dataclass
class DataRow:
    """One prompt row, normalised. `origin` is `file#row` (or `builtin:NAME#row`) for error messages."""

    prompt: Messages | str
    ground_truth: str
    data_source: str
    extra_info: dict[str, Any] = field(default_factory=dict)
    origin: str = ""


def expand_paths(paths: list[str | Path]) -> list[Path]:
    """Files as given; a directory stands for its `*.parquet` files (sorted)."""
    out: list[Path] = []
    for p in paths:
        path = Path(p).expanduser()
        if path.is_dir():
            found = sorted(path.glob("*.parquet"))
            if not found:
                raise DataError(f"{path}: directory contains no .parquet files")
            out.extend(found)
        else:
            out.append(path)
    return out


def _check_messages(value: Any, origin: str, key: str) -> Messages | str:
    if isinstance(value, str):
        return value
    if not isinstance(value, (list, tuple)):
        raise DataError(f"{origin}: column {key!r} must be a list of chat messages or a string, "
                        f"got {type(value).__name__}")
    messages: Messages = []
    for m in value:
        if not isinstance(m, dict) or m.get("role") is None or m.get("content") is None:
            shown = repr(m)[:200]
            raise DataError(f"{origin}: column {key!r} has a message without 'role' and 'content': {shown}")
        messages.append({"role": str(m["role"]), "content": str(m["content"])})
    return messages


def normalize_row(raw: dict[str, Any], origin: str, prompt_key: str = "prompt") -> DataRow:
    """A `DataRow` from a verl-layout dict (as read from parquet or made by `engine.data.builtin`)."""
    reward_model = raw.get("reward_model")
    if not isinstance(reward_model, dict) or "ground_truth" not in reward_model:
        raise DataError(f"{origin}: column 'reward_model' has no 'ground_truth' field")
    truth = reward_model["ground_truth"]
    extra = raw.get("extra_info")
    return DataRow(
        prompt=_check_messages(raw.get(prompt_key), origin, prompt_key),
        ground_truth="" if truth is None else str(truth),
        data_source="" if raw.get("data_source") is None else str(raw["data_source"]),
        extra_info=dict(extra) if isinstance(extra, dict) else {},
        origin=origin,
    )


def read_parquet_file(path: Path, prompt_key: str = "prompt") -> list[DataRow]:
    """All rows of one verl-format parquet file."""
    import pyarrow.parquet as pq

    if not path.exists():
        raise DataError(f"{path}: no such file")
    try:
        schema = pq.read_schema(path)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for a bad file
        raise DataError(f"{path}: cannot read as parquet ({type(exc).__name__}: {exc})") from exc
    names = set(schema.names)
    for required in (prompt_key, "reward_model"):
        if required not in names:
            raise DataError(f"{path}: missing column {required!r} (columns: {', '.join(sorted(names))})")
    wanted = [c for c in (prompt_key, "data_source", "reward_model", "extra_info") if c in names]
    try:
        records = pq.read_table(path, columns=wanted).to_pylist()
    except Exception as exc:  # noqa: BLE001
        raise DataError(f"{path}: cannot read as parquet ({type(exc).__name__}: {exc})") from exc
    return [normalize_row(r, f"{path}#{i}", prompt_key) for i, r in enumerate(records)]


def read_parquet(paths: list[str | Path], prompt_key: str = "prompt") -> list[DataRow]:
    """The rows of every file in `paths` (directories expanded), in order."""
    rows: list[DataRow] = []
    for path in expand_paths(paths):
        rows.extend(read_parquet_file(path, prompt_key))
    return rows
