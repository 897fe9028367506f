"""`asyncrl launch` ends a successful run with its validation curve, read from the run's metrics.jsonl."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from engine.telemetry.val_curve import (
    format_validation_curve,
    show_validation_curve,
    validation_curve,
    written_run_dir,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
RECORDED = FIXTURES / "run_tiny" / "metrics.jsonl"


def test_reads_the_validation_records_of_a_recorded_run() -> None:
    points = validation_curve(RECORDED)
    assert [p.version for p in points] == [4, 8, 12, 16, 20]
    assert all(set(p.accuracy) == {"asyncrl/copy"} for p in points)
    assert all(p.time_s is not None and p.time_s > 0 for p in points)
    assert [p.time_s for p in points] == sorted(p.time_s for p in points)


def _write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def test_accepts_the_acc_and_the_old_reward_key_and_prefers_acc(tmp_path: Path) -> None:
    metrics = _write(tmp_path / "metrics.jsonl", [
        {"training/global_step": 1, "critic/rewards/mean": 0.2},  # a training step: not validation
        {"fully_async/count/current_param_version": 0, "asyncrl/time": 31.0,
         "val-core/asyncrl/arith/reward/mean@1": 0.333},
        {"fully_async/count/current_param_version": 5, "asyncrl/time": 95.4,
         "val-core/asyncrl/arith/acc/mean@1": 0.625, "val-core/asyncrl/arith/reward/mean@1": 0.7},
        "not a record",
        {"fully_async/count/current_param_version": 10, "asyncrl/time": 190.0,
         "val-core/asyncrl/arith/acc/mean@1": 0.75},
    ])
    with metrics.open("a") as f:
        f.write("{truncated\n")
    points = validation_curve(metrics)
    assert [(p.version, p.accuracy["asyncrl/arith"]) for p in points] == [(0, 0.333), (5, 0.625), (10, 0.75)]
    text = format_validation_curve(points)
    lines = text.splitlines()
    assert lines[1].split() == ["version", "wall", "asyncrl/arith"]
    assert lines[2].split() == ["0", "0:31", "0.333"]
    assert lines[4].split() == ["10", "3:10", "0.750"]
    assert "0.333 → 0.750 (+0.417) over 3 validations" in text


def test_reads_mean_at_n_of_a_validation_at_n_answers_and_never_best_or_maj(tmp_path: Path) -> None:
    metrics = _write(tmp_path / "metrics.jsonl", [
        {"fully_async/count/current_param_version": 2, "asyncrl/time": 12.0,
         "val-core/lookup/acc/best@4/mean": 0.9, "val-core/lookup/acc/maj@4/mean": 0.7,
         "val-core/lookup/acc/mean@4": 0.5, "val-aux/lookup/acc/mean@2": 0.1},
        {"fully_async/count/current_param_version": 4, "asyncrl/time": 24.0, "val-core/lookup/acc/mean@4": 0.75},
    ])
    points = validation_curve(metrics)
    assert [(p.version, p.accuracy, p.n) for p in points] == [(2, {"lookup": 0.5}, 4), (4, {"lookup": 0.75}, 4)]
    assert format_validation_curve(points).splitlines()[0] == \
        "validation accuracy (val-core mean@4, per data source):"


def test_no_validation_prints_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write(tmp_path / "metrics.jsonl", [{"training/global_step": 1, "critic/rewards/mean": 0.2}])
    assert validation_curve(tmp_path / "missing.jsonl") == []
    show_validation_curve(0, tmp_path)
    assert capsys.readouterr().out == ""


def test_printed_after_success_only_from_the_directory_the_run_wrote(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    configured = tmp_path / "tiny-cpu"
    configured.mkdir()
    _write(configured / "metrics.jsonl", [{"fully_async/count/current_param_version": 0, "asyncrl/time": 1.0,
                                          "val-core/asyncrl/copy/acc/mean@1": 0.1}])
    other = tmp_path / "tiny-cpu-sync"  # another preset's run: never taken for this one
    other.mkdir()
    stamped = tmp_path / "tiny-cpu-20261201-201526"  # the driver's fresh directory for a re-run
    shutil.copytree(configured, stamped)
    _write(stamped / "metrics.jsonl", [{"fully_async/count/current_param_version": 400, "asyncrl/time": 90.0,
                                       "val-core/asyncrl/copy/acc/mean@1": 0.9}])
    _write(other / "metrics.jsonl", [{"fully_async/count/current_param_version": 7, "asyncrl/time": 2.0,
                                     "val-core/asyncrl/copy/acc/mean@1": 0.5}])
    os.utime(configured / "metrics.jsonl", (1e9, 1e9))  # the earlier run
    assert written_run_dir(configured) == stamped
    show_validation_curve(1, configured)
    assert capsys.readouterr().out == ""
    show_validation_curve(0, configured)
    out = capsys.readouterr().out
    assert "400" in out and "0.900" in out and "0.500" not in out


def test_launch_prints_the_curve_at_the_end_of_a_successful_run(
    cli, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The launch command, with the driver replaced by one that replays a recorded run's metrics."""
    import engine.runtime.driver as driver

    def fake_run(plan, **kwargs) -> int:  # launch hands the driver a RunPlan
        run_dir = Path(plan.config.logging.run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        shutil.copy(RECORDED, run_dir / "metrics.jsonl")
        return 0

    monkeypatch.setattr(driver, "run", fake_run)
    preset = Path(__file__).resolve().parents[2] / "presets" / "runs" / "tiny-cpu.toml"
    result = cli("launch", preset, "--set", f"logging.run_dir={tmp_path / 'runs' / 'x'}")
    assert result.exit_code == 0, result.output
    assert "validation accuracy" in result.output
    assert [line.split()[0] for line in result.output.splitlines() if line.strip()[:2] in ("4 ", "8 ")] == ["4", "8"]
