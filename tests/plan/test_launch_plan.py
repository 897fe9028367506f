"""`asyncrl launch --plan`: the run carries the plan's expectation (plan.json, the run info), the dashboard sets
the measured step time beside it, and a run that cannot be planned is refused before anything starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from asyncrl_cli.tui.format import fmt_num
from asyncrl_cli.tui.model import DashboardModel
from asyncrl_cli.tui.widgets.kpi_row import step_time_kpi
from engine.control.replay import ReplaySource

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "presets" / "runs" / "tiny-cpu.toml"
ASYNCRL = Path(sys.executable).parent / "asyncrl"


def _cli(*args: object, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    return subprocess.run([str(ASYNCRL), *map(str, args)], capture_output=True, text=True, env=env, timeout=timeout)


def test_a_cpu_run_without_a_calibration_is_refused_before_it_starts(tmp_path: Path) -> None:
    run_dir = tmp_path / "never"
    r = _cli("launch", TINY, "--plan", "--set", f'logging.run_dir="{run_dir}"', timeout=60)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "--calibrate" in r.stderr and "Traceback" not in r.stderr
    assert not run_dir.exists()


@pytest.mark.integration
def test_launch_with_a_plan_shows_the_prediction_beside_the_measured_step_time(run_dir: Path, tmp_path: Path) -> None:
    assert _cli("plan", "--calibrate", run_dir).returncode == 0
    cal = run_dir / "calibration.json"
    out = tmp_path / "planned"
    sets = ["--set", f'logging.run_dir="{out}"', "--set", "trainer.total_steps=6", "--set", "trainer.test_freq=0",
            "--set", "logging.progress=false"]
    expected = json.loads(_cli("plan", TINY, "--calibration", cal, "--json", *sets).stdout)["plan"]
    r = _cli("launch", TINY, "--plan", "--calibration", cal, *sets)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert f"plan: step {expected['step_time_s']:.3g} s" in r.stderr
    plan = json.loads((out / "plan.json").read_text())
    assert plan["step_time_s"] == expected["step_time_s"]
    assert set(plan["sources"].values()) == {str(cal)}

    model = DashboardModel()  # the dashboard attached to the finished run reads the same expectation
    model.apply(ReplaySource(out).snapshot(0))
    measured = model.step_time()
    assert measured is not None and measured > 0
    drift = measured / plan["step_time_s"] - 1
    text, _level = step_time_kpi(model)
    assert text == f"{fmt_num(measured, 2)} / {fmt_num(plan['step_time_s'], 2)} {drift:+.0%}"
