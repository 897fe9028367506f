"""`asyncrl validate` with `data.row_adapter`: the CLI imports nothing of the user's (the file must exist, the name
be an identifier); the adapter runs on the first rows of each file in a child process, a bad row one line."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

TINY = Path(__file__).resolve().parents[2] / "presets" / "runs" / "tiny-cpu.toml"
ADAPTER = '''
import os
with open("imported_by.txt", "a") as f:
    f.write(f"{os.getpid()}\\n")

def to_verl(row):
    if row["question"] == "boom":
        raise ValueError("cannot read this row")
    return {"prompt": [{"role": "user", "content": row["question"]}], "data_source": "asyncrl/copy",
            "reward_model": {"ground_truth": row["answer"]}}
'''


def _setup(tmp_path: Path, questions: list[str]) -> str:
    (tmp_path / "adapt.py").write_text(ADAPTER)
    rows = [{"question": q, "answer": "1"} for q in questions + ["copy 3="] * 40]  # enough for one version
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "raw.parquet")
    return f'data.train_files=["{tmp_path / "raw.parquet"}"]'


def test_validate_runs_the_adapter_in_a_child_process_never_in_the_cli(cli, tmp_path: Path) -> None:
    files = _setup(tmp_path, ["copy 1=", "copy 2="])
    r = cli("validate", TINY, "--set", files, "--set", "data.row_adapter=adapt.py:to_verl")
    assert r.exit_code == 0, r.output
    pids = {int(x) for x in (tmp_path / "imported_by.txt").read_text().split()}
    assert pids and os.getpid() not in pids  # imported only by the child that checked the rows


def test_a_row_the_adapter_fails_on_is_an_error_naming_the_row_and_the_adapter(cli, tmp_path: Path) -> None:
    files = _setup(tmp_path, ["copy 1=", "boom"])
    r = cli("validate", TINY, "--set", files, "--set", "data.row_adapter=adapt.py:to_verl")
    assert r.exit_code == 1
    assert "raw.parquet#1: data.row_adapter adapt.py:to_verl raised ValueError: cannot read this row" in r.output


def test_a_missing_file_or_a_bad_name_is_found_without_running_anything(cli, tmp_path: Path) -> None:
    files = _setup(tmp_path, ["copy 1="])
    r = cli("validate", TINY, "--set", files, "--set", "data.row_adapter=nothere.py:to_verl")
    assert r.exit_code == 1 and "no such file" in r.output
    r = cli("validate", TINY, "--set", files, "--set", "data.row_adapter=adapt.py:to-verl")
    assert r.exit_code == 1 and "is not `path/to/file.py:function`" in r.output
    assert not (tmp_path / "imported_by.txt").exists()
