"""Read verl-format parquet datasets into `DataRow`s, with errors that name the file, row and column.

verl's layout (one row per prompt): `prompt` (list of chat messages `{"role", "content"}`; a plain string is
accepted and used verbatim), `data_source: str`, `reward_model: {"style", "ground_truth"}`, `extra_info:
dict` (optional), `ability: str` (optional). The prompt column's name is configurable (`data.prompt_key`).
A dataset in another layout is read through the user's `data.row_adapter` (`engine.data.row_adapter`).

Multimodal rows (verl's `data.image_key`, e.g. geo3k's `images`): a list of images per row, each a
`{"bytes", "path"}` struct (Hugging Face `datasets`' Image feature), raw bytes or a file path (relative to the
parquet file); they are kept as base64 text of the original bytes (`engine.multimodal.images`). A file
without the image column is a `DataError`; an unreadable cell does not fail the read: the row carries the
reason in `image_error` and prompt loading counts and drops it (`engine.data.prompts`).
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
    images: list[str] = field(default_factory=list)
    """base64 text of each encoded image, in placeholder order (empty for text rows)."""
    image_error: str | None = None
    """Why the row's images could not be read (the row is then unusable), else None."""


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


def read_images(cell: Any, base_dir: Path | None = None) -> tuple[list[str], str | None]:
    """(base64 images, None) of an image-column cell (a list of images, or one image), or ([], reason)."""
    from engine.multimodal.images import ImageError, cell_bytes, encode_bytes

    if cell is None:
        return [], None
    items = list(cell) if isinstance(cell, (list, tuple)) else [cell]
    try:
        return [encode_bytes(cell_bytes(item, base_dir)) for item in items], None
    except ImageError as exc:
        return [], str(exc)


def normalize_row(raw: dict[str, Any], origin: str, prompt_key: str = "prompt", image_key: str | None = None,
                  base_dir: Path | None = None) -> DataRow:
    """A `DataRow` from a verl-layout dict (as read from parquet or made by `engine.data.builtin`); with
    `image_key`, the images of that column (paths relative to `base_dir`)."""
    reward_model = raw.get("reward_model")
    if not isinstance(reward_model, dict) or "ground_truth" not in reward_model:
        raise DataError(f"{origin}: column 'reward_model' has no 'ground_truth' field")
    truth = reward_model["ground_truth"]
    extra = raw.get("extra_info")
    images, image_error = read_images(raw.get(image_key), base_dir) if image_key else ([], None)
    return DataRow(
        prompt=_check_messages(raw.get(prompt_key), origin, prompt_key),
        ground_truth="" if truth is None else str(truth),
        data_source="" if raw.get("data_source") is None else str(raw["data_source"]),
        extra_info=dict(extra) if isinstance(extra, dict) else {},
        origin=origin,
        images=images,
        image_error=image_error,
    )


def read_parquet_file(path: Path, prompt_key: str = "prompt", image_key: str | None = None,
                      adapter: Any = None) -> list[DataRow]:
    """All rows of one verl-format parquet file (with the images of column `image_key` when given). With
    `adapter` (`engine.data.row_adapter.RowAdapter`, `data.row_adapter`) every column is read and each raw row
    goes through the adapter first: the file's own columns need not be verl's."""
    import pyarrow.parquet as pq

    if not path.exists():
        raise DataError(f"{path}: no such file")
    try:
        schema = pq.read_schema(path)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for a bad file
        raise DataError(f"{path}: cannot read as parquet ({type(exc).__name__}: {exc})") from exc
    names = set(schema.names)
    if adapter is None:
        for required in (prompt_key, "reward_model"):
            if required not in names:
                raise DataError(f"{path}: missing column {required!r} (columns: {', '.join(sorted(names))})")
        if image_key and image_key not in names:
            raise DataError(f"{path}: missing image column {image_key!r} (data.image_key; columns: "
                            f"{', '.join(sorted(names))})")
    wanted = None if adapter is not None else \
        [c for c in (prompt_key, "data_source", "reward_model", "extra_info", image_key) if c and c in names]
    try:
        records = pq.read_table(path, columns=wanted).to_pylist()
    except Exception as exc:  # noqa: BLE001
        raise DataError(f"{path}: cannot read as parquet ({type(exc).__name__}: {exc})") from exc
    if adapter is not None:
        from engine.data.row_adapter import adapted_row

        return [adapted_row(adapter, r, f"{path}#{i}", prompt_key, image_key, path.parent)
                for i, r in enumerate(records)]
    return [normalize_row(r, f"{path}#{i}", prompt_key, image_key, path.parent) for i, r in enumerate(records)]


def read_parquet(paths: list[str | Path], prompt_key: str = "prompt", image_key: str | None = None,
                 adapter: Any = None) -> list[DataRow]:
    """The rows of every file in `paths` (directories expanded), in order (through `adapter` when given)."""
    rows: list[DataRow] = []
    for path in expand_paths(paths):
        rows.extend(read_parquet_file(path, prompt_key, image_key, adapter))
    return rows
