"""`asyncrl plan` through the command line: the seed layout (128 GPUs) predicts async faster than sync in
seconds, the tiny preset predicts from a calibration, `--calibrate` writes one, `--sweep` ranks layouts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from asyncrl_cli.app import app

ROOT = Path(__file__).resolve().parents[2]
RUNS = ROOT / "presets" / "runs"
SEED = RUNS / "qwen3-30b-a3b-base-dapo-megatron-96-32.toml"


def _plan(*args: str):
    return CliRunner().invoke(app, ["plan", *map(str, args)])


def test_seed_layout_predicts_async_faster_than_sync_in_seconds() -> None:
    r = _plan(SEED, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    plan, sync = doc["plan"], doc["sync"]
    assert doc["layout"]["replicas"] == 24 and doc["layout"]["trainer_world"] == 32
    assert doc["speedup_vs_sync"] > 1.0 and plan["samples_per_s"] > sync["samples_per_s"]
    assert plan["step_time_s"] > 0 and 0.0 <= plan["trainer_idle_ratio"] <= 1.0
    assert set(plan["staleness_hist"]) == {"0", "1"}  # staleness 0.5 at trigger 4: at most one version old
    assert sync["staleness_hist"].keys() == {"0"}
    assert plan["time_to_end_s"] > 400 * plan["version_time_s"] * 0.9  # 400 versions
    assert plan["sync_pause_s"] >= doc["costs"]["sync_s"] * (1 - 1e-9) and plan["violations"] == []  # float sums
    assert "colocated" in doc and doc["colocated"]["trainer_world"] == 128


def test_seed_layout_table_names_its_cost_sources() -> None:
    r = _plan(SEED)
    assert r.exit_code == 0, r.output
    assert "async ÷ sync" in r.output and "estimate" in r.output and "η_bw" in r.output


def test_tiny_preset_needs_a_calibration_and_says_how(tmp_path: Path) -> None:
    r = _plan(RUNS / "tiny-cpu.toml")
    assert r.exit_code == 1
    assert "--calibrate" in r.output and "Traceback" not in r.output


def test_calibrate_then_plan_the_tiny_preset(run_dir: Path) -> None:
    r = _plan("--calibrate", run_dir)
    assert r.exit_code == 0, r.output
    cal = run_dir / "calibration.json"
    assert cal.is_file() and "measured" in r.output
    r = _plan(RUNS / "tiny-cpu-sync.toml", "--calibration", cal, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    measured = json.loads(cal.read_text())["measured"]
    assert abs(doc["plan"]["samples_per_s"] / measured["samples_per_s"] - 1) < 0.1  # the run it came from
    assert doc["plan"]["cpu_contention"] is True
    assert all(v.endswith("calibration.json") for v in doc["costs"]["sources"].values())


def test_sweep_ranks_layouts_and_says_which_side_idles() -> None:
    r = _plan(SEED, "--sweep", "rollout_fraction=0.5:0.75,trigger=2:4", "--json", "--top", "10")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    pts = doc["points"]
    assert doc["simulated"] == 4 and len(pts) == 4
    speeds = [p["samples_per_s"] for p in pts]
    assert speeds == sorted(speeds, reverse=True)
    assert {(p["rollout_world"], p["trainer_world"]) for p in pts} == {(64, 64), (96, 32)}
    assert all(p["reason"].split(":")[0] in ("rollout-bound", "trainer-bound", "balanced") for p in pts)
    r = _plan(SEED, "--sweep", "staleness=0:0.5", "--top", "1")
    assert r.exit_code == 0 and "best 1 of 2" in r.output


def test_bad_sweep_and_missing_files_are_usage_errors(tmp_path: Path) -> None:
    assert _plan(SEED, "--sweep", "gpus").exit_code == 2
    assert _plan(SEED, "--sweep", "trigger=a:b").exit_code == 2
    assert _plan(tmp_path / "nope.toml").exit_code == 2
    assert _plan(SEED, "--calibration", tmp_path / "none.json").exit_code == 2
    assert _plan("--calibrate", tmp_path / "nothing").exit_code == 2
    assert _plan().exit_code == 2


def test_plan_keeps_the_cli_import_light() -> None:
    # the predictor and the simulator load only when `asyncrl plan` runs (engine.plan's preset locator is light)
    heavy = ("engine.predict.costs", "engine.predict.prediction", "engine.predict.sweep", "engine.predict.calibrate", "engine.loop",
             "torch", "ray")
    code = ("import sys, asyncrl_cli.app; "
            f"print(sorted(m for m in sys.modules if m.startswith({heavy!r})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_the_plan_models_the_streaming_rollouters_slots_by_default() -> None:
    """A replica serves several dispatches at once (the streaming rollouter: one group of n rows per call, up to
    `STREAM_CALLS` calls); `--slots 1` is the old one-dispatch-per-replica model."""
    from engine.loop.dispatch import STREAM_CALLS, Capacity, replica_slots
    from engine.predict.costs import SIM_REPLICAS, plan_slots

    preset = RUNS / "qwen2.5-math-7b-dapo-fsdp2-64-64.toml"  # 16 replicas of max_num_seqs ≥ 12 groups
    default = json.loads(_plan(preset, "--json").output)
    one = json.loads(_plan(preset, "--json", "--slots", "1").output)
    lay = default["layout"]
    assert lay["slots"] == min(STREAM_CALLS, lay["seqs_per_call"] // lay["n"], SIM_REPLICAS // lay["replicas"]) == 2
    assert one["layout"]["slots"] == 1
    assert (default["plan"], default["sync"]) != (one["plan"], one["sync"])  # the slots change the simulated replicas, hence the prediction
    # the slot count is the dispatches the loop's Capacity hands one replica while work is scarce
    cap, rows_out, calls = Capacity(rows=64, calls=STREAM_CALLS), 0, 0
    while (room := cap.room(8, rows_out, calls)) > 0 and room == 8:
        rows_out, calls = rows_out + room, calls + 1
    assert replica_slots(64, 8) == calls == 8  # 8 single groups of n fill its 64 rows
    assert replica_slots(4, 8) == 1 and replica_slots(4096, 8) == STREAM_CALLS
    assert plan_slots(4096, 8, replicas=1, in_flight=100) == STREAM_CALLS
    assert plan_slots(4096, 8, replicas=64, in_flight=1000) == 1  # the simulation's budget
    assert plan_slots(4096, 8, replicas=2, in_flight=6) == 3  # no more slots than groups out at once
    assert plan_slots(256, 8, replicas=1, in_flight=32) == 8  # 8 slots of 4 groups hold all 32 in one round


SEED_002 = RUNS / "qwen3-vl-8b-geo3k-fsdp2-npu-2x8.toml"  # the 16-16 file's 910C preset has no cost figures


def test_seed_layouts_model_lending_idle_trainer_devices_to_rollout() -> None:
    """`plan --json` carries the lending term (modelled, not built) for both seed layouts, with its formula; the
    predicted version time follows it from the plan's own steady state."""

    for preset in (SEED, SEED_002):
        r = _plan(preset, "--json")
        assert r.exit_code == 0, r.output
        doc = json.loads(r.output)
        lend, plan = doc["lending"], doc["plan"]
        assert lend["built"] is False and "T'" in lend["formula"]
        assert lend["trainer_idle_ratio"] == plan["trainer_idle_ratio"]
        assert lend["predicted_gain"] >= 1.0
        assert lend["predicted_version_time_s"] == pytest.approx(plan["version_time_s"] / lend["predicted_gain"])
        assert lend["lendable_replicas"] == doc["layout"]["trainer_world"] // doc["layout"]["rollout_tp"]
    assert "lending idle trainer devices" in _plan(SEED).output


def test_lending_gains_nothing_when_the_trainer_never_waits_and_more_when_it_waits_longer() -> None:
    from types import SimpleNamespace

    from engine.loop.sim.scenario import Scenario
    from engine.predict.costs import Layout
    from engine.predict.lending import lending_gain

    layout = Layout("x", Scenario(0, n=8, ppo_mini_batch_size=32, staleness_threshold=0.5, max_new_tokens=512,
                                  seqs_per_call=64).loop(), 128, replicas=4, rollout_tp=2, trainer_world=8,
                    trainer_model_parallel=1, total_versions=None, log_prob_passes=1)
    busy = SimpleNamespace(version_time_s=10.0, trainer_idle_ratio=0.0, rollout_idle_ratio=0.0, sync_pause_s=0.5)
    assert lending_gain(layout, busy)["predicted_gain"] == 1.0
    gains = [lending_gain(layout, SimpleNamespace(version_time_s=10.0, trainer_idle_ratio=i, rollout_idle_ratio=0.0,
                                                  sync_pause_s=0.5))["predicted_gain"] for i in (0.2, 0.4, 0.6)]
    assert 1.0 < gains[0] < gains[1] < gains[2]
    # i = 0.6, u = 1: C = 4, w = 6, own = L = 4, s = 0.5: T' = 4 + 0.5 + 6 · 4 / 8 = 7.5
    assert gains[2] == pytest.approx(10.0 / 7.5)
    # a latency-bound wait (the rollout mostly idle) gains little from more devices
    idle = lending_gain(layout, SimpleNamespace(version_time_s=10.0, trainer_idle_ratio=0.6, rollout_idle_ratio=0.9,
                                                sync_pause_s=0.5))
    assert 1.0 <= idle["predicted_gain"] < gains[0]


def test_keep_rate_sets_what_dynamic_sampling_costs_and_is_printed(run_dir: Path) -> None:
    """`--keep-rate K`: a plan of a run with `algorithm.filter_groups` generates 1 / K groups per trained one (a
    calibration without filtering measured none), and says so; K out of (0, 1] is a usage error."""
    assert _plan("--calibrate", run_dir).exit_code == 0
    cal = run_dir / "calibration.json"
    ds = ["--set", "algorithm.filter_groups.enable=true", "--set", "trainer.test_freq=0"]
    docs = {}
    for keep in ("1", "0.5"):
        r = _plan(RUNS / "tiny-cpu.toml", "--calibration", cal, "--keep-rate", keep, "--json", *ds)
        assert r.exit_code == 0, r.output
        docs[keep] = json.loads(r.output)
        assert docs[keep]["costs"]["keep_rate"] == float(keep) and docs[keep]["costs"]["sources"]["keep_rate"] == \
            "--keep-rate"
        assert docs[keep]["layout"]["loop"]["trainer"]["filter_metric"] == "score"
    assert docs["0.5"]["plan"]["step_time_s"] > docs["1"]["plan"]["step_time_s"]
    r = _plan(RUNS / "tiny-cpu.toml", "--calibration", cal, *ds)
    assert r.exit_code == 0 and "dynamic sampling (keep rate 1.00" in r.output and "keep_rate ← default" in r.output
    assert _plan(RUNS / "tiny-cpu.toml", "--calibration", cal, "--keep-rate", "0", *ds).exit_code == 2


def test_calibrate_fits_under_the_slot_model_asked_for(run_dir: Path) -> None:
    """`--calibrate RUN_DIR --slots K`: the decode cost is fitted with the replica model the plans will use (a
    replica of k slots is simulated as k replicas, so the fitted cost depends on k)."""
    docs = {}
    for slots in ([], ["--slots", "1"]):
        r = _plan("--calibrate", run_dir, "--json", *slots)
        assert r.exit_code == 0, r.output
        docs[len(slots)] = json.loads(r.output)
    assert docs[2]["reference"]["slots"] == 1 and docs[0]["reference"]["slots"] > 1
    assert docs[2]["costs"]["decode_step_s"] != docs[0]["costs"]["decode_step_s"]
