"""Study — does a tool help a small model? SmolLM2-135M-Instruct on multi-digit word problems (the built-in
`bigarith` task: 3-digit sums and differences, 2-digit products), trained fully async on CPU in two arms with
the same model, problems, validation set, steps and samples:

- **tool**: `presets/runs/smollm2-tools-cpu.toml` — multi-turn, the model may call `calculator` (Hermes
  format, shown once in the one-shot prompt), read its answer, then answer; validation runs the same agent loop;
- **no tool**: `presets/runs/smollm2-notool-cpu.toml` — single-turn, the one-shot prompt works the sum in the
  answer.

Each arm is launched as a user launches it (`benchmarks.demo_runs.launch`: its own process and local Ray,
times from the command's start), one after the other on the same cores. Per arm it records the greedy
validation curve (`val-core/asyncrl/bigarith/acc/mean@1` on 32 held-out problems, at versions 0, 2 and 4 of
its 8 steps), the validation tool-call rate (`asyncrl/val/tool_call_rate`: answers with at least one call), and
per training step the mean reward (`critic/rewards/mean`: acc + 0.1 × format) and the tool calls per
trajectory (`asyncrl/tools/calls_per_trajectory`).

Compared: the validation accuracy after the same training (the last validation), and the best validation
within the same wall budget (`BUDGET_S` after launch: the tool arm's steps are longer — its tool turns add
tokens and tool latency). One run per arm: the accuracies carry about ±0.08 (32 problems) plus the run's
own spread, which one seed cannot measure.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import PRESETS, finish_result, new_result, table, write_json
from benchmarks.demo_runs import LAUNCH_NOTE, DemoRun, Variant, launch, read_jsonl

STUDY = "tool-use"
BUDGET_S = 900.0
"""The wall budget both arms are compared at (seconds since launch)."""
TOOL, NO_TOOL = PRESETS / "smollm2-tools-cpu.toml", PRESETS / "smollm2-notool-cpu.toml"
TOY = ("rollout.total_rollout_steps=4", "trainer.test_freq=1", "data.val_max_samples=4", "rollout.n=4",
       "trainer.val_before_train=false")


@dataclass(frozen=True)
class Arm:
    variant: Variant
    preset: Path


ARMS = {
    "full": [Arm(Variant("tool", (), "multi-turn with the calculator"), TOOL),
             Arm(Variant("no tool", (), "single-turn, same problems and budget"), NO_TOOL)],
    "toy": [Arm(Variant("tool", TOY), TOOL), Arm(Variant("no tool", TOY), NO_TOOL)],
}


def tool_series(run_dir: Path) -> dict[str, list[float]]:
    """Per validation the tool-call rate, per training step the tool calls per trajectory (0 without tools)."""
    records = read_jsonl(run_dir / "metrics.jsonl")
    vals = [r for r in records if any(k.startswith("val-core/") for k in r)]
    train = [r for r in records if "critic/rewards/mean" in r]
    return {"val_tool_call_rate": [round(float(r.get("asyncrl/val/tool_call_rate", 0.0)), 4) for r in vals],
            "calls_per_trajectory": [round(float(r.get("asyncrl/tools/calls_per_trajectory", 0.0)), 4)
                                     for r in train]}


def best_by(run: DemoRun, seconds: float) -> float | None:
    return run.acc_at_or_before(seconds)


def run(size: str, out_dir: Path) -> dict[str, Any]:
    started = time.monotonic()
    arms = ARMS[size]
    result = new_result(STUDY, size, {"arms": [{"label": a.variant.label, "preset": a.preset.name,
                                                "overrides": list(a.variant.overrides), "why": a.variant.why}
                                               for a in arms], "budget_s": BUDGET_S})
    runs: list[DemoRun] = []
    series: dict[str, dict[str, list[float]]] = {}
    loads: dict[str, list[list[float]]] = {}
    from benchmarks.common import load_average

    with tempfile.TemporaryDirectory(prefix=f"asyncrl-{STUDY}-") as tmp:
        for arm in arms:
            before = load_average()
            r = launch(arm.variant, Path(tmp), timeout_s=2400, preset=arm.preset)
            loads[r.label] = [before, load_average()]
            series[r.label] = tool_series(Path(tmp) / arm.variant.label.replace(" ", "-"))
            runs.append(r)
    result["runs"] = [{**dict(r.__dict__), "final_acc": r.final_acc, **series[r.label], "load_start_end": loads[r.label],
                       "best_acc_by_budget": best_by(r, BUDGET_S)} for r in runs]
    result["tables"] = [
        table("Tool vs no tool (SmolLM2-135M, bigarith, one run each)",
              ["arm", "steps", "median step (s)", "launch to exit (s)", "greedy val at each validation",
               "val tool-call rate at each validation", f"best val by {BUDGET_S:.0f} s", "final val",
               "mean reward first → last 4 steps", "calls/trajectory first → last 4 steps", "load start → end"],
              [_row(r, series[r.label], loads[r.label]) for r in runs]),
        table("Validation curves (32 greedy problems)",
              ["arm", "version", "seconds since launch", "greedy val acc", "val tool-call rate"],
              [[r.label, p["version"], p["time_s"], p["acc"], rate]
               for r in runs for p, rate in zip(r.curve, series[r.label]["val_tool_call_rate"] + [None] * 99)]),
    ]
    by = {r.label: r for r in runs if not r.error}
    targets = []
    if "tool" in by and "no tool" in by:
        t, n = by["tool"], by["no tool"]
        targets.append({"target": "final greedy val: tool arm > no-tool arm (same steps and samples)",
                        "measured": [t.final_acc, n.final_acc], "op": ">", "goal": "no-tool arm",
                        "status": "met" if (t.final_acc or 0) > (n.final_acc or 0) else "missed"})
        bt, bn = best_by(t, BUDGET_S), best_by(n, BUDGET_S)
        targets.append({"target": f"best greedy val by {BUDGET_S:.0f} s: tool arm > no-tool arm",
                        "measured": [bt, bn], "op": ">", "goal": "no-tool arm",
                        "status": "met" if (bt or 0) > (bn or 0) else "missed"})
    result["targets"] = targets
    result["notes"] = [LAUNCH_NOTE, "One run per arm (one seed): no winner is claimed beyond the ±0.08 of 32 "
                       "greedy problems; the runs' own spread is not measured."]
    write_json(finish_result(result, started), out_dir)
    plot(runs, series, out_dir)
    return result


def _row(r: DemoRun, s: dict[str, list[float]], load: list[list[float]]) -> list[Any]:
    if r.error:
        return [r.label, f"error: {r.error[:80]}"] + ["—"] * 9
    first, last = r.rewards[:4], r.rewards[-4:]
    cf, cl = s["calls_per_trajectory"][:4], s["calls_per_trajectory"][-4:]
    mean = statistics.fmean
    return [r.label, r.steps, round(r.median_step_s or 0.0, 1), r.launch_to_exit_s,
            " → ".join(f"{p['acc']:.2f}" for p in r.curve), " → ".join(f"{x:.2f}" for x in s["val_tool_call_rate"]),
            best_by(r, BUDGET_S), r.final_acc,
            f"{mean(first):.3f} → {mean(last):.3f}" if first else "—",
            f"{mean(cf):.2f} → {mean(cl):.2f}" if cf else "—",
            f"{load[0][0]:.2f} → {load[1][0]:.2f}"]


def plot(runs: list[DemoRun], series: dict[str, dict[str, list[float]]], out_dir: Path) -> Path:
    """Validation vs wall time, training reward per step, tool calls per trajectory per step."""
    from benchmarks.plots import pyplot, save

    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for r in (r for r in runs if not r.error):
        axes[0].plot([p["time_s"] for p in r.curve], [p["acc"] for p in r.curve], marker="o", label=r.label)
        axes[1].plot(range(1, len(r.rewards) + 1), r.rewards, label=r.label)
        calls = series[r.label]["calls_per_trajectory"]
        axes[2].plot(range(1, len(calls) + 1), calls, label=r.label)
    axes[0].axvline(BUDGET_S, color="grey", linestyle=":", linewidth=1)
    axes[0].set(xlabel="seconds since launch", ylabel="greedy val accuracy (32 problems)", ylim=(0, 1),
                title="validation vs wall time")
    axes[1].set(xlabel="step", ylabel="critic/rewards/mean", title="training reward")
    axes[2].set(xlabel="step", ylabel="asyncrl/tools/calls_per_trajectory", title="tool calls per trajectory")
    for ax in axes:
        ax.legend(fontsize=7)
    return save(fig, out_dir, STUDY)
