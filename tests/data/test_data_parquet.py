"""Reading verl-format parquet: rows normalised, errors name the file and the column."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine.data.parquet import DataError, read_parquet


def _write(path: Path, rows: list[dict]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


ROW = {
    "data_source": "openai/gsm8k",
    "prompt": [{"role": "user", "content": "What is 2+3?"}],
    "ability": "math",
    "reward_model": {"style": "rule", "ground_truth": "5"},
    "extra_info": {"split": "train", "index": 7},
}


def test_reads_rows_from_files_and_directories(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    _write(tmp_path / "d" / "a.parquet", [ROW])
    _write(tmp_path / "d" / "b.parquet", [{**ROW, "reward_model": {"style": "rule", "ground_truth": 9}}])
    rows = read_parquet([tmp_path / "d", tmp_path / "d" / "a.parquet"])
    assert [r.ground_truth for r in rows] == ["5", "9", "5"]
    assert rows[0].prompt == ROW["prompt"] and rows[0].data_source == "openai/gsm8k"
    assert rows[0].extra_info == {"split": "train", "index": 7}
    assert rows[1].origin.endswith("b.parquet#0")


def test_missing_column_names_file_and_column(tmp_path: Path) -> None:
    path = _write(tmp_path / "x.parquet", [{k: v for k, v in ROW.items() if k != "reward_model"}])
    with pytest.raises(DataError, match=r"x\.parquet: missing column 'reward_model'"):
        read_parquet([path])
    with pytest.raises(DataError, match="missing column 'question'"):
        read_parquet([_write(tmp_path / "y.parquet", [ROW])], prompt_key="question")


def test_missing_ground_truth_field(tmp_path: Path) -> None:
    path = _write(tmp_path / "g.parquet", [{**ROW, "reward_model": {"style": "rule"}}])
    with pytest.raises(DataError, match=r"g\.parquet#0: column 'reward_model' has no 'ground_truth'"):
        read_parquet([path])


def test_unreadable_and_missing_files(tmp_path: Path) -> None:
    junk = tmp_path / "junk.parquet"
    junk.write_text("this is not parquet")
    with pytest.raises(DataError, match=r"junk\.parquet: cannot read as parquet"):
        read_parquet([junk])
    with pytest.raises(DataError, match=r"nope\.parquet: no such file"):
        read_parquet([tmp_path / "nope.parquet"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no .parquet files"):
        read_parquet([tmp_path / "empty"])


def test_malformed_prompt_names_row(tmp_path: Path) -> None:
    path = _write(tmp_path / "m.parquet", [ROW, {**ROW, "prompt": [{"text": "hi", "who": "user"}]}])
    with pytest.raises(DataError, match=r"m\.parquet#1: column 'prompt' has a message without 'role'"):
        read_parquet([path])


def test_plain_string_prompt_is_kept_verbatim(tmp_path: Path) -> None:
    rows = read_parquet([_write(tmp_path / "s.parquet", [{**ROW, "prompt": "copy 123="}])])
    assert rows[0].prompt == "copy 123="
