"""Built-in datasets: deterministic per seed, disjoint splits, verl's row layout, parquet output."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.data import builtin
from engine.data.builtin import BUILTIN_TASKS, builtin_rows, write_dataset


def _prompt_key(row: dict) -> tuple[str, str]:
    """What makes an item (the `lookup` task's prompt is the same for every item: its secret differs)."""
    return row["prompt"][-1]["content"], row["reward_model"]["ground_truth"]


@pytest.mark.parametrize("name", BUILTIN_TASKS)
def test_deterministic_per_seed(name: str) -> None:
    a = builtin_rows(name, "train", seed=0, size=200)
    assert a == builtin_rows(name, "train", seed=0, size=200)
    other = builtin_rows(name, "train", seed=1, size=200)
    assert [_prompt_key(r) for r in a] != [_prompt_key(r) for r in other]


@pytest.mark.parametrize("name", BUILTIN_TASKS)
def test_train_and_val_are_disjoint_even_when_train_cycles(name: str) -> None:
    val = {_prompt_key(r) for r in builtin_rows(name, "val", seed=5, size=builtin.VAL_RESERVE[name])}
    train = builtin_rows(name, "train", seed=5, size=2500)
    assert len(train) == 2500
    assert val.isdisjoint(_prompt_key(r) for r in train)


def test_copy_and_reverse_rows() -> None:
    row = builtin_rows("copy", "train", seed=0, size=1)[0]
    digits = row["reward_model"]["ground_truth"]
    assert row["prompt"] == [{"role": "user", "content": f"copy {digits}="}]
    assert row["data_source"] == "asyncrl/copy" and row["reward_model"]["style"] == "rule"
    assert row["extra_info"] == {"split": "train", "index": 0}
    for r in builtin_rows("reverse", "val", seed=0, size=20):
        shown = r["prompt"][0]["content"].removeprefix("rev ").removesuffix("=")
        assert len(shown) == 3 and r["reward_model"]["ground_truth"] == shown[::-1]


def test_arith_rows_use_the_one_shot_prompt_and_are_correct() -> None:
    rows = builtin_rows("arith", "val", seed=0)
    assert len(rows) == 64
    for r in rows:
        system, ex_user, ex_assistant, question = r["prompt"]
        assert system == {"role": "system", "content":
                          "Solve the math problem. Think briefly, then end your reply with '#### <number>'."}
        assert ex_user["content"] == "Sara has 12 pens and buys 5 more. How many pens does Sara have now?"
        assert ex_assistant == {"role": "assistant", "content": "Sara has 12 + 5 = 17 pens.\n#### 17"}
        numbers = [int(w.rstrip(".")) for w in question["content"].split() if w.rstrip(".").isdigit()]
        a, b = numbers
        expected = a + b if " buys " in question["content"] else a - b
        assert r["reward_model"]["ground_truth"] == str(expected)
        assert 0 <= expected <= 18 and r["ability"] == "math"


def test_bad_name_split_and_size() -> None:
    with pytest.raises(ValueError, match="copy, reverse, arith"):
        builtin_rows("gsm8k", "train")
    with pytest.raises(ValueError, match="split"):
        builtin_rows("copy", "test")
    with pytest.raises(ValueError, match="val_size"):
        builtin_rows("copy", "val", size=1000)


def test_write_dataset_round_trips_through_parquet(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    paths = write_dataset("arith", tmp_path / "arith", seed=2, train_size=10, val_size=4)
    assert set(paths) == {"train", "val"}
    train = pq.read_table(paths["train"]).to_pylist()
    assert train == builtin_rows("arith", "train", seed=2, size=10)
    assert pq.read_table(paths["val"]).num_rows == 4
