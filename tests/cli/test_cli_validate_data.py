"""`asyncrl validate` catches what `launch` would refuse: dataset columns (schema only), reward functions,
non-finite numbers — as errors with exit 1, naming the file and column or the function."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

TINY = Path(__file__).resolve().parents[2] / "presets" / "runs" / "tiny-cpu.toml"
MESSAGES = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))


def _table(**drop_or_replace) -> pa.Table:
    cols = {"prompt": pa.array([[{"role": "user", "content": "12"}]], MESSAGES),
            "data_source": pa.array(["asyncrl/copy"]),
            "reward_model": pa.array([{"style": "rule", "ground_truth": "12"}])}
    for k, v in drop_or_replace.items():
        if v is None:
            cols.pop(k)
        else:
            cols[k] = v
    return pa.table(cols)


def _run(tmp_path: Path, train: pa.Table, reward: str = "auto", extra: str = "") -> Path:
    pq.write_table(train, tmp_path / "train.parquet")
    run = tmp_path / "run.toml"
    run.write_text(f'extends = ["{TINY}"]\n[data]\ntrain_files = ["train.parquet"]\nreward = "{reward}"\n{extra}'
                   '[rollout]\ntotal_rollout_steps = 64\n[trainer]\ntotal_epochs = 100\n')
    return run


def test_a_good_parquet_file_validates(cli, tmp_path: Path) -> None:
    r = cli("validate", _run(tmp_path, _table()))
    assert r.exit_code == 0, r.output


def test_a_train_file_without_prompt_fails_naming_file_and_column(cli, tmp_path: Path) -> None:
    r = cli("validate", _run(tmp_path, _table(prompt=None)))
    assert r.exit_code == 1
    assert "train.parquet: missing column 'prompt'" in r.stdout and "data.train_files" in r.stdout


def test_a_missing_ground_truth_and_a_wrong_prompt_type_fail_at_once(cli, tmp_path: Path) -> None:
    table = _table(prompt=pa.array([3]), reward_model=pa.array([{"style": "rule"}]))
    r = cli("validate", _run(tmp_path, table))
    assert r.exit_code == 1
    assert "column 'prompt' is int64" in r.stdout
    assert "column 'reward_model' has no 'ground_truth' field" in r.stdout
    assert "2 errors" in r.stdout


def test_auto_reward_needs_data_source(cli, tmp_path: Path) -> None:
    r = cli("validate", _run(tmp_path, _table(data_source=None)))
    assert r.exit_code == 1 and "missing column 'data_source'" in r.stdout
    assert cli("validate", _run(tmp_path, _table(data_source=None), reward="copy")).exit_code == 0


@pytest.mark.parametrize(("reward", "says"), [
    ("no_such_module_xyz:score", "cannot import reward module 'no_such_module_xyz'"),
    ("engine.data.rewards:no_such_function", "has no function 'no_such_function'"),
    ("os:system", "cannot be called as fn(response_text, ground_truth"),
])
def test_an_unusable_reward_function_fails(cli, tmp_path: Path, reward: str, says: str) -> None:
    r = cli("validate", _run(tmp_path, _table(), reward=reward))
    assert r.exit_code == 1
    assert says in " ".join(r.stdout.split())


def test_a_user_reward_file_with_verl_signature_validates(cli, tmp_path: Path) -> None:
    (tmp_path / "my_reward.py").write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n")
    assert cli("validate", _run(tmp_path, _table(), reward="my_reward.py:compute_score")).exit_code == 0


@pytest.mark.parametrize("setting", ["async_training.staleness_threshold=inf", "trainer.optim.lr=nan",
                                     'algorithm.rollout_correction.rollout_is_threshold="inf"'])
def test_non_finite_numbers_are_refused_with_the_key(cli, setting: str) -> None:
    r = cli("validate", TINY, "--set", setting)
    assert r.exit_code == 1, r.output
    assert setting.split("=")[0] in r.stdout and "finite" in r.stdout and "internal error" not in r.output
