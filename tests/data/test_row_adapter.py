"""`data.row_adapter = "file.py:fn"`: a dataset in its own layout, turned into verl's rows by the user's function
when the data is read; a failing row is one line naming the row and the adapter."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine.data.parquet import DataError
from engine.data.prompts import load_prompts
from engine.data.row_adapter import check_first_rows, spec_problem
from engine.models.tiny import build_tiny_tokenizer

ADAPTER = '''
def to_verl(row):
    if row["question"] == "boom":
        raise KeyError("no answer for boom")
    if row["question"] == "bare":
        return {"prompt": [{"role": "user", "content": row["question"]}]}
    return {"prompt": [{"role": "user", "content": row["question"]}], "data_source": "mine/" + row["kind"],
            "reward_model": {"ground_truth": str(row["answer"])}, "extra_info": {"id": row["id"]}}

def not_a_dict(row):
    return [row]
'''


def _data(tmp_path: Path, questions: list[str]) -> str:
    rows = [{"id": i, "question": q, "answer": 100 + i, "kind": "copy"} for i, q in enumerate(questions)]
    path = tmp_path / "raw.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def _cfg(files: list[str], spec: str) -> dict:
    return {"train_files": files, "val_files": [], "max_prompt_length": 64, "reward": "copy", "prompt_key": "prompt",
            "filter_overlong_prompts": True, "shuffle": False, "seed": 0, "train_size": None, "val_size": None,
            "val_max_samples": None, "row_adapter": spec}


@pytest.fixture()
def adapter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "adapt.py").write_text(ADAPTER)
    monkeypatch.chdir(tmp_path)  # relative paths are read from the working directory
    return tmp_path


def test_rows_in_another_layout_are_read_through_the_adapter(adapter: Path) -> None:
    files = [_data(adapter, ["copy 12=", "copy 3="])]
    prompts, counters = load_prompts(_cfg(files, "adapt.py:to_verl"), build_tiny_tokenizer())
    assert counters["kept"] == 2
    assert [(p.ground_truth, p.data_source, p.extra_info) for p in prompts] == \
        [("100", "mine/copy", {"id": 0}), ("101", "mine/copy", {"id": 1})]
    assert prompts[0].prompt_ids and prompts[0].prompt_ids != prompts[1].prompt_ids


def test_a_row_the_adapter_fails_on_is_one_line_naming_the_row_and_the_adapter(adapter: Path) -> None:
    files = [_data(adapter, ["copy 1=", "boom"])]
    with pytest.raises(DataError) as err:
        load_prompts(_cfg(files, "adapt.py:to_verl"), build_tiny_tokenizer())
    msg = str(err.value)
    assert "raw.parquet#1: data.row_adapter adapt.py:to_verl raised KeyError: 'no answer for boom'" in msg
    assert "\n" not in msg


def test_an_adapter_output_outside_verls_layout_names_the_adapter_and_the_layout(adapter: Path) -> None:
    files = [_data(adapter, ["bare"])]
    with pytest.raises(DataError, match=r"raw\.parquet#0: column 'reward_model' has no 'ground_truth' field — in "
                                        r"the row data\.row_adapter adapt\.py:to_verl returned \(verl's layout"):
        load_prompts(_cfg(files, "adapt.py:to_verl"), build_tiny_tokenizer())
    with pytest.raises(DataError, match=r"#0: data\.row_adapter adapt\.py:not_a_dict returned list, not a dict"):
        load_prompts(_cfg(files, "adapt.py:not_a_dict"), build_tiny_tokenizer())


def test_spec_checks_import_nothing_and_the_first_rows_check_finds_the_bad_row(adapter: Path) -> None:
    assert spec_problem("adapt.py:to_verl") is None
    assert "no such file" in (spec_problem("missing.py:to_verl") or "")
    assert "is not `path/to/file.py:function`" in (spec_problem("adapt.py:1bad") or "")
    good, bad = _data(adapter, ["copy 1="]), str(adapter / "bad.parquet")
    pq.write_table(pa.Table.from_pylist([{"id": 0, "question": "boom", "answer": 1, "kind": "x"}]), bad)
    assert check_first_rows("adapt.py:to_verl", [good]) == []
    (problem,) = check_first_rows("adapt.py:to_verl", [good, bad])
    assert problem.startswith(f"{bad}#0: data.row_adapter adapt.py:to_verl raised KeyError")
    assert check_first_rows("adapt.py:nope", [good]) == \
        [f"data.row_adapter 'adapt.py:nope': {(adapter / 'adapt.py').resolve()} has no function 'nope' "
         "(def fn(row: dict) -> dict)"]
