"""What `launch` would refuse about the data and the reward, found by `validate` without reading the data.

- Dataset files (local parquet, directories expanded): only the schema is read (`pyarrow.parquet.read_schema`,
  imported when a parquet file is configured). A run needs, in verl's row layout, the prompt column
  (`data.prompt_key`: a string or a list of `{role, content}` structs), `reward_model` (a struct with a
  `ground_truth` field), `data_source` (a string; required when `data.reward = "auto"` picks the reward by
  it), and the image column when `data.image_key` is set. Each missing or mistyped column is an error naming
  the file and the column. Files that do not exist here are `path_rules`' warning (the cluster may have them).
- `data.row_adapter`: the files are read through the user's adapter, so their own schema is not checked;
  `row_adapter_rules` checks the adapter on their first rows in a child process (`engine.data.row_adapter`).
- A user reward `module:function` or `file.py:function`: imported (its top-level code runs; the function is
  never called) and checked to take the documented arguments (`engine.data.rewards.SIGNATURE`); a module
  that does not import, a missing function or one like `os:system` is an error.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from asyncrl_cli.config.problems import Problem
from engine.config.schema import RunConfig


def _err(code: str, key: str, msg: str, hint: str | None = None) -> Problem:
    return Problem("error", code, msg, key, hint=hint)


def _local_parquet(files: list[str], base_dir: Path | None) -> list[Path]:
    out: list[Path] = []
    for f in files:
        if f.startswith("builtin:") or "${" in f:
            continue
        path = Path(os.path.expanduser(f))
        if not path.is_absolute() and not path.exists() and base_dir is not None and (base_dir / path).exists():
            path = base_dir / path
        if path.is_dir():
            out.extend(sorted(path.glob("*.parquet")))
        elif path.is_file():
            out.append(path)
    return out


def _prompt_type_ok(t: Any) -> bool:
    import pyarrow as pa

    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return True
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        v = t.value_type
        return pa.types.is_struct(v) and {"role", "content"} <= {v.field(i).name for i in range(v.num_fields)}
    return False


def schema_problems(path: Path, schema: Any, cfg: RunConfig, key: str) -> list[Problem]:
    """The problems of one parquet file's schema (rules in the module docstring)."""
    import pyarrow as pa

    d = cfg.data
    names = set(schema.names)
    cols = ", ".join(sorted(names))
    out: list[Problem] = []

    def missing(col: str, why: str) -> None:
        out.append(_err("data-column-missing", key, f"{path}: missing column {col!r} ({why}; columns: {cols})"))

    if d.prompt_key not in names:
        missing(d.prompt_key, "data.prompt_key: the prompt")
    elif not _prompt_type_ok(schema.field(d.prompt_key).type):
        out.append(_err("data-column-type", key, f"{path}: column {d.prompt_key!r} is "
                        f"{schema.field(d.prompt_key).type}, not a string or a list of {{role, content}} messages"))
    if "reward_model" not in names:
        missing("reward_model", "its ground_truth is what the reward compares with")
    else:
        t = schema.field("reward_model").type
        fields = {t.field(i).name for i in range(t.num_fields)} if pa.types.is_struct(t) else set()
        if "ground_truth" not in fields:
            out.append(_err("data-column-type", key, f"{path}: column 'reward_model' has no 'ground_truth' field "
                            f"(type {t})"))
    if "data_source" in names:
        t = schema.field("data_source").type
        if not (pa.types.is_string(t) or pa.types.is_large_string(t)):
            out.append(_err("data-column-type", key, f"{path}: column 'data_source' is {t}, not a string"))
    elif d.reward == "auto":
        missing("data_source", 'data.reward = "auto" picks the reward by it')
    if d.image_key and d.image_key not in names:
        missing(d.image_key, "data.image_key: the images")
    return out


def dataset_rules(cfg: RunConfig, base_dir: Path | None) -> list[Problem]:
    """Schema problems of the local parquet files of `data.train_files` and `data.val_files` (with
    `data.row_adapter`: the adapter's output on their first rows instead, `row_adapter_rules`)."""
    if cfg.data.row_adapter:
        return row_adapter_rules(cfg, base_dir)
    out: list[Problem] = []
    for key in ("data.train_files", "data.val_files"):
        paths = _local_parquet(getattr(cfg.data, key.split(".")[1]), base_dir)
        if not paths:
            continue
        import pyarrow.parquet as pq  # only when a parquet file is configured and here

        for path in paths:
            try:
                schema = pq.read_schema(path)
            except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for a bad file
                out.append(_err("data-unreadable", key, f"{path}: cannot read as parquet ({type(exc).__name__})"))
                continue
            out += schema_problems(path, schema, cfg, key)
    return out


ROW_ADAPTER_TIMEOUT_S = 120.0
"""How long `validate` lets the row adapter's check run (importing it and adapting the first rows)."""


def row_adapter_rules(cfg: RunConfig, base_dir: Path | None) -> list[Problem]:
    """`data.row_adapter`: in this process only that the file exists and the name is an identifier (nothing of
    the user's is imported here); then, in a child process (`python -m engine.data.row_adapter`), the adapter
    on the first rows of each local parquet file must give rows in verl's layout. A child keeps the user's
    code, its imports, crashes and hangs out of the CLI (a timeout ends it)."""
    import json
    import subprocess
    import sys

    from engine.data.row_adapter import CHECK_ROWS, SIGNATURE, spec_problem

    spec = cfg.data.row_adapter
    assert spec is not None
    problem = spec_problem(spec)
    if problem is not None:
        return [_err("row-adapter-unusable", "data.row_adapter", problem, f"an adapter is {SIGNATURE}")]
    files = [str(p) for key in ("train_files", "val_files") for p in _local_parquet(getattr(cfg.data, key), base_dir)]
    if not files:
        return []
    args = json.dumps({"spec": spec, "files": files, "prompt_key": cfg.data.prompt_key,
                       "image_key": cfg.data.image_key})
    import engine

    root = str(Path(engine.__file__).resolve().parents[1])  # the child imports this engine, installed or not
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    try:
        done = subprocess.run([sys.executable, "-m", "engine.data.row_adapter", args], capture_output=True,
                              text=True, timeout=ROW_ADAPTER_TIMEOUT_S, check=False, env=env)
    except subprocess.TimeoutExpired:
        return [_err("row-adapter-timeout", "data.row_adapter", f"data.row_adapter {spec}: checking it on the first "
                     f"{CHECK_ROWS} rows of each file took over {ROW_ADAPTER_TIMEOUT_S:.0f} s")]
    lines = done.stdout.strip().splitlines()
    try:
        problems = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        problems = None
    if not isinstance(problems, list):
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return [_err("row-adapter-unusable", "data.row_adapter", f"data.row_adapter {spec}: its check failed "
                     f"(exit {done.returncode}): {tail}")]
    return [_err("row-adapter-row", "data.row_adapter", str(p), f"an adapter is {SIGNATURE}") for p in problems]


def reward_rules(cfg: RunConfig) -> list[Problem]:
    """A user reward function that does not import or does not take the documented arguments."""
    spec = cfg.data.reward
    if ":" not in spec:
        return []
    from engine.data.rewards import SIGNATURE, user_reward_problem

    problem = user_reward_problem(spec)
    if problem is None:
        return []
    hint = None if SIGNATURE in problem else f"a reward function is {SIGNATURE}"
    return [_err("reward-unusable", "data.reward", problem, hint)]
