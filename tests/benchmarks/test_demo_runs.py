"""The demo studies' reductions (precision, demo-sweep, and the asyncrl side of trl-grpo): a run directory as
the engine writes it becomes times since launch, the validation landmarks and the mismatch means."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.demo_runs import Variant, runs_table, summarize
from benchmarks.demo_sweep import rank_key
from benchmarks.trl_grpo import _targets, summarize_asyncrl

T0 = 1_000_000.0  # epoch just before the launch command


def write_run(run_dir: Path, vals: list[tuple[int, float, float]], steps: int, kl: float = 0.01) -> Path:
    """A run directory: validations (version, seconds since launch, acc) and `steps` training records."""
    run_dir.mkdir(parents=True)
    records, events = [], []
    for version, since_launch, acc in vals:
        records.append({"fully_async/count/current_param_version": version, "asyncrl/time": since_launch - 10.0,
                        "val-core/asyncrl/arith/acc/mean@1": acc})
        events.append({"time": T0 + since_launch, "kind": "validation"})
    for k in range(1, steps + 1):
        records.append({"critic/rewards/mean": 0.1 * k, "timing_s/step": 10.0 + k, "actor/response_tokens": 100.0,
                        "asyncrl/time": 20.0 * k, "asyncrl/rollout/tokens_per_s": 50.0, "rollout_corr/kl": kl,
                        "fully_async/rollouter/active_time": 5.0, "asyncrl/count/filtered_groups": 2 * k,
                        "rollout_corr/ppl_ratio": 1.0 + kl})
    events.insert(1, {"time": T0 + 1.0, "kind": "sync"})  # other events are ignored
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    return run_dir


def test_validation_times_are_seconds_since_the_launch_command(tmp_path: Path) -> None:
    d = write_run(tmp_path / "a", [(0, 30.0, 0.3), (5, 200.0, 0.8), (10, 400.0, 0.9)], steps=10)
    run = summarize(Variant("a", ("x=1",)), d, T0, 0, 420.0)
    assert [p["time_s"] for p in run.curve] == [30.0, 200.0, 400.0]
    assert run.time_to(0.78) == 200.0 and run.time_to(0.95) is None
    assert run.acc_at_or_before(300.0) == 0.8 and run.acc_at_or_before(10.0) is None
    assert run.final_acc == 0.9 and run.steps == 10 and run.median_step_s == pytest.approx(15.5)
    # trained tokens/s: 1000 response tokens from the first validation (asyncrl/time 20) to the last step (200)
    assert run.trained_tokens == 1000.0 and run.trained_tokens_per_s == pytest.approx(1000.0 / 180.0)
    # the sampler's busy rate: 50 tokens/s × 200 s of reports over 10 × 5 s with a call out
    assert run.busy_tokens_per_s == pytest.approx(50.0 * 200.0 / 50.0)
    assert run.mismatch["kl"] == pytest.approx(0.01) and "rollout_rs_masked_fraction" not in run.mismatch
    assert run.filtered_groups == 20  # dynamic sampling's count at the last step


def test_sweep_ranks_by_accuracy_within_five_minutes_then_speed(tmp_path: Path) -> None:
    slow_high = summarize(Variant("slow"), write_run(tmp_path / "s", [(0, 30, 0.3), (5, 320, 0.95)], 5), T0, 0, 1)
    early = summarize(Variant("early"), write_run(tmp_path / "e", [(0, 30, 0.3), (5, 250, 0.8)], 5), T0, 0, 1)
    earlier = summarize(Variant("earlier"), write_run(tmp_path / "r", [(0, 30, 0.3), (5, 150, 0.8)], 5), T0, 0, 1)
    assert [r.label for r in sorted([slow_high, early, earlier], key=rank_key)] == ["earlier", "early", "slow"]
    table = runs_table("t", [early])
    assert table["rows"][0][4] == "0.30 → 0.80" and len(table["rows"][0]) == len(table["columns"])


def test_trl_targets_compare_time_to_threshold_and_read_the_demo_targets(tmp_path: Path) -> None:
    fast = summarize(Variant("asyncrl-async"), write_run(tmp_path / "f", [(0, 30, 0.3), (5, 150, 0.8),
                                                                         (10, 290, 0.9)], 10), T0, 0, 470.0)
    sync = summarize(Variant("asyncrl-sync"), write_run(tmp_path / "y", [(0, 30, 0.3), (5, 180, 0.8)], 5), T0, 0, 1)
    trl = {"label": "trl-bf16", "time_to_threshold_s": 450.0}
    rows = {t["target"]: t for t in _targets([trl, summarize_asyncrl(sync), summarize_asyncrl(fast)], "bf16")}
    assert rows["TRL bf16 time to val 0.75 ÷ asyncrl fully async's"]["measured"] == 3.0
    assert rows["TRL fp32 time to val 0.75 ÷ asyncrl fully async's"]["status"] == "not measured"
    assert rows["asyncrl sync time to val 0.75 ÷ fully async's"]["measured"] == 1.2
    assert rows["demo: best greedy val within 300 s of launch"]["status"] == "met"
    assert rows["demo: last greedy val"]["status"] == "met" and rows["demo: launch to exit"]["status"] == "met"


def test_trl_targets_read_the_in_loop_sampler_rates(tmp_path: Path) -> None:
    sync = summarize_asyncrl(summarize(Variant("asyncrl-sync"), write_run(tmp_path / "y", [(0, 30, 0.3)], 10),
                                       T0, 0, 1))
    trl = {"label": "trl-fp32", "sampling_tokens_per_s": 50.0}
    rows = {t["target"]: t for t in _targets([trl, sync], "fp32")}
    row = rows["hf sampler (asyncrl sync) ÷ TRL fp32 `generate`, tokens/s inside the loop"]
    assert row["measured"] == 4.0 and row["status"] == "met"  # 200 busy tokens/s against 50


@pytest.mark.parametrize("study", ["precision", "demo-sweep"])
def test_study_writes_its_json_and_plot_from_the_runs(tmp_path: Path, monkeypatch, study: str) -> None:
    """The study's pipeline around the launches (which the full studies make for real): every variant is
    launched once, in order, and the JSON holds its runs, the tables and the ranking or targets."""
    import importlib

    import benchmarks.demo_runs as demo_runs

    module = importlib.import_module({"precision": "benchmarks.precision", "demo-sweep": "benchmarks.demo_sweep"}[study])
    launched: list[str] = []

    def fake_launch(variant: Variant, root: Path, timeout_s: float):
        launched.append(variant.label)
        d = write_run(tmp_path / "runs" / f"{len(launched)}", [(0, 30, 0.3), (5, 150 + len(launched), 0.8)], 5)
        return summarize(variant, d, T0, 0, 200.0)

    monkeypatch.setattr(demo_runs, "launch", fake_launch)
    variants = module.VARIANTS["full"]
    result = module.run("full", tmp_path / "out", variants=variants)
    assert launched == [v.label for v in variants]
    saved = json.loads((tmp_path / "out" / f"{study}.json").read_text())
    assert [r["label"] for r in saved["runs"]] == launched and (tmp_path / "out" / f"{study}.png").exists()
    assert saved["params"]["variants"][0]["overrides"] == list(variants[0].overrides)
    assert len(result["tables"][0]["rows"]) == len(variants)
    if study == "demo-sweep":
        assert saved["ranking"][0] == launched[0]  # all reach 0.8; the first reached it soonest
    else:
        assert saved["targets"][0]["measured"] == pytest.approx(1.0)  # equal step times: bf16 ÷ fp32 = 1


def test_tool_use_reads_the_tool_rates_and_compares_at_the_budget(tmp_path: Path) -> None:
    from benchmarks.tool_use import BUDGET_S, best_by, tool_series

    d = write_run(tmp_path / "tool", [(0, 60.0, 0.25), (2, 500.0, 0.4), (4, BUDGET_S + 100, 0.6)], steps=3)
    records = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
    for r in records:
        if "val-core/asyncrl/arith/acc/mean@1" in r:
            r["asyncrl/val/tool_call_rate"] = r["val-core/asyncrl/arith/acc/mean@1"] + 0.1
        else:
            r["asyncrl/tools/calls_per_trajectory"] = r["critic/rewards/mean"] * 2
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    s = tool_series(d)
    assert s == {"val_tool_call_rate": [0.35, 0.5, 0.7], "calls_per_trajectory": [0.2, 0.4, 0.6]}
    run = summarize(Variant("tool"), d, T0, 0, BUDGET_S + 120)
    assert best_by(run, BUDGET_S) == 0.4 and run.final_acc == 0.6  # the last validation came after the budget
    single = write_run(tmp_path / "no-tool", [(0, 50.0, 0.1)], steps=2)
    assert tool_series(single)["val_tool_call_rate"] == [0.0]  # a single-turn run calls nothing


def test_a_plain_score_reward_is_read_as_the_validation_accuracy(tmp_path: Path) -> None:
    """`gsm8k` returns a bare score, so its validation key is `…/reward/mean@1`; an `acc` key wins when present."""
    d = write_run(tmp_path / "gsm8k", [(0, 40.0, 0.25), (2, 300.0, 0.5)], steps=2)
    text = (d / "metrics.jsonl").read_text().replace("val-core/asyncrl/arith/acc/mean@1",
                                                      "val-core/asyncrl/bigarith/reward/mean@1")
    (d / "metrics.jsonl").write_text(text)
    assert [p["acc"] for p in summarize(Variant("g"), d, T0, 0, 320.0).curve] == [0.25, 0.5]
    both = {"val-core/x/reward/mean@1": 0.9, "val-core/x/acc/mean@1": 0.4}
    from benchmarks.demo_runs import val_accuracy

    assert val_accuracy(both) == 0.4


def test_demo_seeds_reads_the_demo_targets_per_seed(tmp_path: Path, monkeypatch) -> None:
    """Three seeds of the demo as shipped and in sync mode: ≤ 480 s launch to exit in every shipped seed, ≥ 0.78
    within 300 s in 2 of 3, and sync's time to greedy val 0.75 ÷ the shipped run's per seed (a run that never
    gets there counts its whole wall); each run's "auto" choices come from its machine.json."""
    import benchmarks.demo_runs as demo_runs
    from benchmarks import demo_seeds

    curves = {0: [(0, 30, 0.25), (5, 276, 0.83)], 1: [(0, 30, 0.25), (5, 290, 0.79)],
              2: [(0, 30, 0.25), (5, 310, 0.9)]}  # seed 2 reaches 0.9, but after 300 s
    sync_curves = {0: [(0, 30, 0.25), (5, 400, 0.8)], 1: [(0, 30, 0.25), (5, 300, 0.77)],
                   2: [(0, 30, 0.25), (5, 420, 0.7)]}  # seed 2 never reaches 0.75 in sync
    walls = {0: 470.0, 1: 478.0, 2: 497.0}
    launched = []

    def fake_launch(variant: Variant, root: Path, timeout_s: float):
        launched.append(variant.label)
        seed = int(variant.overrides[0].split("=")[1])
        sync = 'async_training.mode="sync"' in variant.overrides
        d = write_run(root / variant.label.replace(" ", "-"), (sync_curves if sync else curves)[seed], 20)
        (d / "machine.json").write_text(json.dumps({"choices": [{"key": "trainer.precision", "value": "bf16"}]}))
        return summarize(variant, d, T0, 0, walls[seed] + (100.0 if sync else 0.0))

    monkeypatch.setattr(demo_runs, "launch", fake_launch)
    result = demo_seeds.run("full", tmp_path / "out")
    assert launched == [f"{a} seed {s}" for s in (0, 1, 2) for a in ("shipped", "sync")]
    rows = {t["target"]: t for t in result["targets"]}
    slowest = rows["make demo launch to exit, slowest seed"]
    assert (slowest["measured"], slowest["status"]) == (497.0, "missed")
    early = rows["seeds with greedy val ≥ 0.78 within 300 s of launch"]
    assert (early["measured"], early["status"]) == (2, "met")
    assert [r["auto"] for r in result["runs"]] == [{"trainer.precision": "bf16"}] * 6
    compared = result["async_vs_sync"]
    assert compared["ratios"] == [round(400 / 276, 3), round(300 / 290, 3), round(597 / 310, 3)]
    ratio = rows["sync ÷ fully async, time to greedy val 0.75 (median of seeds)"]
    assert (ratio["measured"], ratio["status"]) == (round(400 / 276, 3), "met")
    assert compared["reached"] == {"shipped": [True] * 3, "sync": [True, True, False]}
    # every sync seed (570–597 s) ends after every shipped one (470–497 s): a winner; time to 0.75 overlaps
    assert compared["launch_to_exit_s"]["winner"] == "shipped"
    assert compared["time_to_level_s"]["winner"] is None


def test_trl_study_at_equal_terms_compares_seed_by_seed(tmp_path: Path, monkeypatch) -> None:
    """Size `seeds`: per seed TRL fp32, TRL bf16, then asyncrl fully async (interleaved); per TRL precision the
    ratios t_TRL(0.75) ÷ t_async(0.75) by seed (a TRL run that never gets there counts its whole wall); TRL's best
    precision is the one with the lower median time, the equal one is what asyncrl's trainer chose at launch."""
    import benchmarks.trl_grpo as study

    trl_times = {("fp32", 0): 600.0, ("fp32", 1): 660.0, ("fp32", 2): 700.0,
                 ("bf16", 0): 450.0, ("bf16", 1): None, ("bf16", 2): 400.0}  # bf16 seed 1 never reaches 0.75
    launched: list[str] = []

    partial = tmp_path / "out" / "trl-grpo.partial.json"

    def fake_trl(spec_path: Path, precision: str, timeout_s: float, suffix: str = "") -> dict:
        if launched:  # an interrupted study keeps every run finished so far
            assert [r["label"] for r in json.loads(partial.read_text())["runs"]] == launched
        launched.append(f"trl-{precision}{suffix}")
        seed = int(suffix.split()[-1])
        assert json.loads(spec_path.read_text())["seed"] == seed  # TRL's seed is the run's trainer.seed
        return {"label": f"trl-{precision}{suffix}", "time_to_threshold_s": trl_times[precision, seed],
                "wall_s": 900.0, "n_steps": 20, "median_step_s": 30.0, "tokens": 1, "tokens_per_s": 1.0,
                "sampling_tokens_per_s": 1.0, "curve": []}

    def fake_launch(variant: Variant, root: Path, timeout_s: float):
        launched.append(variant.label)
        d = write_run(root / variant.label.replace(" ", "-"), [(0, 30, 0.3), (5, 300, 0.8)], 10)
        (d / "machine.json").write_text(json.dumps({"choices": [{"key": "trainer.precision", "value": "bf16"}]}))
        return summarize(variant, d, T0, 0, 470.0)

    monkeypatch.setattr(study, "trl_python", lambda: Path("python"))
    monkeypatch.setattr(study, "run_trl", fake_trl)
    monkeypatch.setattr(study, "launch_demo", fake_launch)
    monkeypatch.setattr(study, "build_spec", lambda cfg, work: {"seed": cfg.trainer.seed})
    result = study.run("seeds", tmp_path / "out")
    assert not partial.exists() and (tmp_path / "out" / "trl-grpo.json").exists()
    from benchmarks.report import load_results, render

    assert "TRL at its best precision (bf16)" in render(load_results(tmp_path / "out"))  # docs/benchmarks.md shows it
    assert launched == [f"{name} seed {s}" for s in (0, 1, 2) for name in ("trl-fp32", "trl-bf16", "asyncrl-async")]
    compared = result["equal_terms"]
    assert compared["ratios"] == {"fp32": [2.0, 2.2, 2.333], "bf16": [1.5, 3.0, 1.333]}
    assert (compared["best"], compared["equal"]) == ("bf16", "bf16")  # median 450 s against 660 s
    rows = {t["target"]: t for t in result["targets"]}
    best = rows["TRL at its best precision (bf16) time to val 0.75 ÷ asyncrl fully async's (median of seeds)"]
    assert (best["measured"], best["status"]) == (1.5, "met")


def test_a_runs_records_are_kept_without_its_checkpoints(tmp_path: Path) -> None:
    from benchmarks.demo_runs import keep_records

    run_dir = tmp_path / "run"
    (run_dir / "checkpoints" / "global_step_2").mkdir(parents=True)
    (run_dir / "checkpoints" / "global_step_2" / "model.safetensors").write_bytes(b"\0" * 1024)
    for name in ("metrics.jsonl", "events.jsonl", "run.log"):
        (run_dir / name).write_text(f"{name}\n")
    kept = keep_records(run_dir, tmp_path / "kept" / "seed-0")
    assert kept == str(tmp_path / "kept" / "seed-0")  # outside the repository: an absolute path
    assert sorted(p.name for p in (tmp_path / "kept" / "seed-0").iterdir()) == ["events.jsonl", "metrics.jsonl",
                                                                                  "run.log"]
    assert (tmp_path / "kept" / "seed-0" / "metrics.jsonl").read_text() == "metrics.jsonl\n"
    assert keep_records(tmp_path / "empty", tmp_path / "kept" / "none") is None
