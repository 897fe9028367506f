"""User row adapters: `data.row_adapter = "path/to/file.py:fn"` turns a dataset's own rows into verl's layout.

The adapter is a plain Python function the user writes (asyncrl's answer to verl's `data.custom_cls`, which
cannot be loaded without verl):

    def fn(row: dict) -> dict

`row` is one raw parquet row (every column, as `pyarrow`'s `to_pylist` gives it); the result is one row in
verl's layout, read as the files are (`engine.data.parquet.normalize_row`): the prompt column
(`data.prompt_key`: a list of `{"role", "content"}` messages, or a string), `reward_model: {"ground_truth"}`,
`data_source: str`, optionally `extra_info: dict` (and the image column with `data.image_key`). It runs on
every row of `data.train_files` and `data.val_files` parquet files when they are read (the rollouter's data
loading), not on `builtin:` tasks. A row it fails on stops the load with one line naming the row
(`file#index`) and the adapter (`DataError`).

Relative paths are read from the directory asyncrl runs in (as a reward's `file.py:function`). The CLI never
imports the user's file: `asyncrl validate` checks in its own process that the file exists and the name is an
identifier (`spec_problem`), then runs the adapter on the first rows of each configured file in a child
process (`python -m engine.data.row_adapter`, `check_first_rows`): the user's code, its imports and any crash
or hang stay out of the CLI, and a bad adapter is found before the cluster starts.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.data.parquet import DataError, normalize_row

SIGNATURE = "def fn(row: dict) -> dict"
"""What `data.row_adapter` names (a raw row in, verl's row layout out)."""
LAYOUT = ('{"prompt": [{"role": "user", "content": ...}], "data_source": str, '
          '"reward_model": {"ground_truth": ...}, "extra_info": dict}')
"""verl's row layout, as error messages show it."""
SPEC = re.compile(r"^(?P<file>[^:\s]+\.py):(?P<fn>[A-Za-z_]\w*)$")
CHECK_ROWS = 5
"""Rows per file `validate` runs the adapter on."""


def spec_problem(spec: str) -> str | None:
    """Why `spec` cannot name an adapter, without importing anything of the user's: not `file.py:fn`, the
    function name not an identifier, or no such file (relative to the working directory); else None."""
    m = SPEC.match(spec)
    if m is None or not m["fn"].isidentifier():
        return f"data.row_adapter {spec!r} is not `path/to/file.py:function` (a function {SIGNATURE})"
    path = Path(m["file"]).expanduser()
    if not path.is_file():
        return f"data.row_adapter {spec!r}: no such file {path.resolve()}"
    return None


class RowAdapter:
    """The loaded adapter: `adapt(raw, origin)` returns its verl-layout row or raises a one-line `DataError`."""

    def __init__(self, spec: str, fn: Callable[[dict[str, Any]], Any]) -> None:
        self.spec, self.fn = spec, fn

    def adapt(self, raw: dict[str, Any], origin: str) -> dict[str, Any]:
        try:
            out = self.fn(dict(raw))
        except Exception as exc:  # noqa: BLE001 - the user's code may raise anything
            text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise DataError(f"{origin}: data.row_adapter {self.spec} raised {type(exc).__name__}: {text}"[:600]) \
                from None
        if not isinstance(out, dict):
            raise DataError(f"{origin}: data.row_adapter {self.spec} returned {type(out).__name__}, not a dict "
                            f"in verl's row layout {LAYOUT}")
        return out


def load_row_adapter(spec: str) -> RowAdapter:
    """Import the adapter's file (its top-level code runs) and take the function; `DataError` when it cannot."""
    problem = spec_problem(spec)
    if problem is not None:
        raise DataError(problem)
    m = SPEC.match(spec)
    assert m is not None
    path = Path(m["file"]).expanduser().resolve()
    name = f"asyncrl_row_adapter_{abs(hash(str(path)))}"
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise DataError(f"data.row_adapter {spec!r}: cannot import {path}")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001
        raise DataError(f"data.row_adapter {spec!r}: importing {path} raised {type(exc).__name__}: "
                        f"{str(exc).strip()[:300]}") from None
    fn = getattr(module, m["fn"], None)
    if not callable(fn):
        raise DataError(f"data.row_adapter {spec!r}: {path} has no function {m['fn']!r} ({SIGNATURE})")
    return RowAdapter(spec, fn)


def adapted_row(adapter: RowAdapter, raw: dict[str, Any], origin: str, prompt_key: str, image_key: str | None,
                base_dir: Path | None) -> Any:
    """`normalize_row` of the adapter's output, a layout error naming the adapter too."""
    try:
        return normalize_row(adapter.adapt(raw, origin), origin, prompt_key, image_key, base_dir)
    except DataError as exc:
        msg = str(exc)
        if "data.row_adapter" in msg:
            raise
        raise DataError(f"{msg} — in the row data.row_adapter {adapter.spec} returned "
                        f"(verl's layout: {LAYOUT})") from None


def check_first_rows(spec: str, files: list[str], prompt_key: str = "prompt", image_key: str | None = None,
                     limit: int = CHECK_ROWS) -> list[str]:
    """Problems (one line each) of the adapter on the first `limit` rows of each parquet file in `files`."""
    import pyarrow.parquet as pq

    from engine.data.parquet import expand_paths

    try:
        adapter = load_row_adapter(spec)
        paths = expand_paths(list(files))
    except DataError as exc:
        return [str(exc)]
    out: list[str] = []
    for path in paths:
        try:
            head = pq.ParquetFile(path).iter_batches(batch_size=limit)
            rows = next(head).to_pylist()[:limit] if path.is_file() else []
        except StopIteration:
            rows = []
        except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for a bad file
            out.append(f"{path}: cannot read as parquet ({type(exc).__name__})")
            continue
        for i, raw in enumerate(rows):
            try:
                adapted_row(adapter, raw, f"{path}#{i}", prompt_key, image_key, path.parent)
            except DataError as exc:
                out.append(str(exc))
                break
    return out


def main(argv: list[str]) -> int:
    """`python -m engine.data.row_adapter '{"spec", "files", "prompt_key", "image_key"}'`: prints a JSON list
    of problems (empty: the adapter gives verl-layout rows on the first rows of every file)."""
    args = json.loads(argv[0])
    problems = check_first_rows(args["spec"], args["files"], args.get("prompt_key", "prompt"),
                                args.get("image_key"))
    print(json.dumps(problems))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
