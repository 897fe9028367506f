"""The numbers the benchmarks publish: speedup formulas, target verdicts, run summaries, the docs page."""

from __future__ import annotations

import math

import pytest

from benchmarks.engine_runs import summarize
from benchmarks.metrics import final_stats, gb_per_s, ideal_speedup, overlap_efficiency, within_noise
from benchmarks.report import render
from benchmarks.targets import describe, evaluate


def test_ideal_speedup_is_total_over_the_longest_phase() -> None:
    assert ideal_speedup(3.0, 1.0) == pytest.approx(4.0 / 3.0)
    assert ideal_speedup(2.0, 2.0) == pytest.approx(2.0)  # equal phases: overlap can at most halve the time
    assert ideal_speedup(5.0, 0.0) == pytest.approx(1.0)  # nothing to hide
    assert overlap_efficiency(1.5, 2.0) == pytest.approx(0.75)
    with pytest.raises(ValueError):
        ideal_speedup(0.0, 0.0)


def test_final_stats_and_noise() -> None:
    curve = [0.0] * 10 + [0.5, 0.7, 0.6]
    mean, se = final_stats(curve)  # last 20 % of 13 points → 3 points
    assert mean == pytest.approx(0.6)
    assert se == pytest.approx(0.1 / math.sqrt(3))
    assert within_noise(0.6, se, 0.65, se)
    assert not within_noise(0.6, 0.01, 0.9, 0.01)
    assert gb_per_s(2e9, 0.5) == pytest.approx(4.0)


def test_target_verdicts_say_how_far_off() -> None:
    floor = evaluate("speedup", 1.2, 1.6, ">=", "×")
    assert floor["status"] == "missed" and floor["missed_by_pct"] == 25.0
    assert describe(floor) == "missed by 25.0 %"
    ceiling = evaluate("help", 0.45, 0.3, "<=", "s")
    assert ceiling["status"] == "missed" and ceiling["missed_by_pct"] == 50.0
    assert evaluate("validate", 0.5, 0.6, "<=")["status"] == "met"
    assert evaluate("reward", False, True, "true")["status"] == "missed"
    absent = evaluate("vllm", None, 1.25, "<=", why_missing="no venv")
    assert describe(absent) == "not measured (no venv)"


def _record(step: int, t: float, reward: float, gen: float, total: float) -> dict:
    return {
        "training/global_step": step,
        "asyncrl/time": t,
        "critic/rewards/mean": reward,
        "timing_s/gen": gen,
        "timing_s/step": total,
        "asyncrl/staleness/mean": 0.5,
        "asyncrl/staleness/max": 1,
        "fully_async/partial/partial_ratio": 0.25,
    }


def test_summarize_uses_the_steady_state_after_the_first_step() -> None:
    # step 1 ends at t=5 (the trainer's model load overlapped the first generation), then 2 s per step
    records = [_record(k, 5.0 + 2.0 * (k - 1), 0.1 * k, 1.5, 2.0) for k in range(1, 6)]
    records.append({"val-core/copy/acc/mean@1": 0.9})  # validation records are not training steps
    ledger = [{"status": "trained"}] * 20 + [{"status": "in_flight_at_end"}] * 3
    s = summarize("x", ["a=1"], records, ledger, wall_s=30.0)
    assert s.steps == 5 and s.trained_prompts == 20
    assert s.train_wall_s == 13.0 and s.steady_wall_s == 8.0
    assert s.prompts_per_s == pytest.approx(16 / 8.0)  # 4 of the 5 steps' prompts over steps 2…5
    assert s.t_gen == pytest.approx(4 * 1.5) and s.t_train == pytest.approx(4 * 0.5)
    assert s.median_step_s == 2.0 and s.curve["gen_s"] == [1.5] * 5
    assert s.final_reward == pytest.approx(0.4)  # mean of the last 3 of 5 rewards
    assert s.staleness_max == 1 and s.partial_ratio == pytest.approx(0.25)
    with pytest.raises(ValueError):
        summarize("empty", [], [], [], 1.0)


def test_report_renders_tables_targets_and_load_warning() -> None:
    result = {
        "study": "cli-latency",
        "size": "full",
        "command": "python -m benchmarks cli-latency",
        "date": "2025-01-01T00:00:00+00:00",
        "load_before": [3.2, 3.0, 2.0],
        "load_after": [3.1, 3.0, 2.0],
        "study_wall_s": 12.0,
        "machine": {
            "cpu": "Test CPU",
            "cores": 2,
            "ram_gib": 8.0,
            "os": "Linux",
            "versions": {"torch": "2.13"},
            "commit": "abc123",
        },
        "tables": [
            {"title": "CLI", "columns": ["command", "median (s)"], "rows": [["`asyncrl --help`", 0.4]]}
        ],
        "targets": [evaluate("`asyncrl --help`", 0.4, 0.3, "<=", "s"),
                    evaluate("seeds at the early bar", 3, 2, ">=", "of 3"),
                    evaluate("speed-up", 1.2, 1.25, ">=", "×")],
        "notes": ["a note"],
    }
    text = render({"cli-latency": result})
    assert "| `asyncrl --help` | 0.4 |" in text
    assert "missed by 33.3 %" in text
    assert "| 0.4 s | ≤ 0.3 s |" in text  # a unit in letters stands apart from its number, a symbol sticks
    assert "| 3 of 3 | ≥ 2 of 3 | met |" in text and "| 1.2× | ≥ 1.25× |" in text
    assert "Test CPU (ISA flags not recorded), 2 cores, 8.0 GiB RAM" in text
    assert "Ran from commit `abc123` (tree state not recorded)" in text
    assert "machine was shared" in text and "cli-latency (3.2 → 3.1)" in text
    assert "![cli-latency](../benchmarks/results/cli-latency.png)" in text
    assert "Not run yet:" in text


def test_a_study_from_a_dirty_tree_is_marked_with_its_diff_hash() -> None:
    result = {"study": "cli-latency", "size": "full", "command": "c", "date": "2025-01-01T00:00:00+00:00",
              "load_before": [0.1, 0.1, 0.1], "load_after": [0.1, 0.1, 0.1], "study_wall_s": 1.0,
              "machine": {"cpu": "Xeon", "isa": ["avx512_bf16", "avx512f"], "cores": 2, "ram_gib": 8.0, "os": "L",
                          "versions": {}, "commit": "abc123", "dirty": True, "diff_sha256": "d1ff"},
              "tables": [], "targets": [], "notes": []}
    text = render({"cli-latency": result})
    assert "(ran from a dirty tree)" in text
    assert "Ran from commit `abc123` (**dirty tree**, diff sha256 `d1ff`) · CPU Xeon (avx512_bf16, avx512f), 2 cores" in text
    result["machine"].update(dirty=False, diff_sha256=None)
    text = render({"cli-latency": result})
    assert "dirty tree" not in text and "commit `abc123` (clean tree)" in text


def test_source_info_sees_a_dirty_tree_but_not_the_studys_own_results(tmp_path, monkeypatch) -> None:
    import subprocess

    import benchmarks.common as common

    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("add", "code.py")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c")
    monkeypatch.setattr(common, "REPO", tmp_path)
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "benchmarks" / "results" / "study.json").write_text("{}")  # what a study writes itself
    clean = common.source_info()
    assert clean["dirty"] is False and clean["diff_sha256"] is None and len(clean["commit"]) >= 7
    (tmp_path / "code.py").write_text("x = 2\n")
    one = common.source_info()
    (tmp_path / "code.py").write_text("x = 3\n")
    other = common.source_info()
    assert one["dirty"] and other["dirty"] and one["diff_sha256"] != other["diff_sha256"]
    (tmp_path / "code.py").write_text("x = 1\n")
    (tmp_path / "new.py").write_text("y = 1\n")  # an untracked file is a difference too
    assert common.source_info()["dirty"] is True


def test_the_report_check_catches_a_hand_edit_of_the_generated_page(tmp_path) -> None:
    """docs/benchmarks.md is rebuilt from the results and notes by every full study: `report --check` (run by
    `make lint`) fails on a hand edit, which the next study would silently drop."""
    from benchmarks.common import RESULTS_DIR
    from benchmarks.report import stale_report, write_report

    page = write_report(RESULTS_DIR, tmp_path / "benchmarks.md")
    assert stale_report(RESULTS_DIR, page) is None
    page.write_text(page.read_text() + "\n## A section written by hand\n")
    problem = stale_report(RESULTS_DIR, page)
    assert problem is not None and "benchmarks/notes" in problem
