"""Bad files a user hands to `validate` and `import verl`: each ends with exit 1 and one clear line naming the
file and the problem — never a traceback, never an "internal error", and `import verl` writes nothing.

The tool-config cases are the corpus' `cases/tools_*.toml` (which `test_bad_inputs` launches with `--dry-run`),
here through `asyncrl validate`; their YAML files are in `data/tools/`. The verl scripts are in
`data/verl_scripts/` (`make_data.py` writes the two that are not text).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from test_bad_inputs import CASES, HERE, parse_case

SCRIPTS = HERE / "data" / "verl_scripts"
TOOL_CASES = [p for p in CASES if p.name.startswith("tools_")]


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> tuple[int, str]:
    """`asyncrl ARGV` through the console entry point; returns (exit code, stdout + stderr)."""
    from asyncrl_cli.app import main

    monkeypatch.setattr(sys, "argv", ["asyncrl", *argv])
    try:
        main()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def assert_one_clear_line(code: int, out: str, message: str) -> None:
    assert "Traceback" not in out and "internal error" not in out, out
    assert code == 1, out
    assert len([ln for ln in out.splitlines() if message in ln]) == 1, out


def test_there_are_tool_config_cases() -> None:
    assert len(TOOL_CASES) >= 6


@pytest.mark.parametrize("case_path", TOOL_CASES, ids=lambda p: p.stem)
def test_validate_refuses_a_bad_tool_config(case_path: Path, capsys, monkeypatch) -> None:
    case = parse_case(case_path)
    monkeypatch.setenv("BAD_INPUTS", str(HERE))
    monkeypatch.chdir(case_path.parent)
    code, out = run_cli(["validate", case_path.name], capsys, monkeypatch)
    assert_one_clear_line(code, out, case.message)
    assert "rollout.multi_turn.tool_config_path" in out


def test_validate_reports_a_missing_dataset_as_an_error(capsys, monkeypatch) -> None:
    monkeypatch.setenv("BAD_INPUTS", str(HERE))
    monkeypatch.chdir(HERE / "cases")
    code, out = run_cli(["validate", "data_missing_file.toml"], capsys, monkeypatch)
    assert_one_clear_line(code, out, "no such file")
    assert "is invalid" in out and "data.train_files" in out


def test_a_placeholder_dataset_for_the_cluster_stays_a_warning(capsys, monkeypatch, tmp_path) -> None:
    """A path that is an environment variable's default, with the variable unset here: a cluster run's template."""
    run = tmp_path / "run.toml"
    run.write_text('extends = ["runs/tiny-cpu"]\n[data]\ntrain_files = ["${MY_TRAIN:-/nowhere/train.parquet}"]\n')
    monkeypatch.delenv("MY_TRAIN", raising=False)
    code, out = run_cli(["validate", str(run)], capsys, monkeypatch)
    assert code == 0 and "MY_TRAIN (unset)" in out and "not found here" in out, out
    monkeypatch.setenv("MY_TRAIN", str(tmp_path / "missing.parquet"))  # set, and still missing: an error
    code, out = run_cli(["validate", str(run)], capsys, monkeypatch)
    assert_one_clear_line(code, out, "no such file")


SCRIPT_CASES = {
    "division_by_zero.sh": "$((512 / 0)): division by zero",
    "infinite_epochs.sh": "not a finite number: '1e999'",
    "empty.sh": "the script is empty",
    "no_launch_command.sh": "no verl launch command",
    "not_utf8.sh": "not UTF-8 text (byte 0xe9",
    "binary.sh": "a binary file",
}


@pytest.mark.parametrize("name", sorted(SCRIPT_CASES))
def test_import_verl_refuses_a_bad_script(name: str, tmp_path: Path, capsys, monkeypatch) -> None:
    out_file = tmp_path / "run.toml"
    code, out = run_cli(["import", "verl", str(SCRIPTS / name), "-o", str(out_file)], capsys, monkeypatch)
    assert_one_clear_line(code, out, SCRIPT_CASES[name])
    assert not out_file.exists()
