"""Study — does a tool help a small model? SmolLM2-135M-Instruct on multi-digit word problems (the built-in
`bigarith` task: 3-digit sums and differences, 2-digit products), trained fully async on CPU in two arms with
the same model, problems, validation set, steps, samples, temperature and reward:

- **tool**: `presets/runs/smollm2-tools-cpu.toml` — multi-turn, the model may call `calculator` (Hermes
  format, shown once in the one-shot prompt), read its answer, then answer; validation runs the same agent loop;
- **no tool**: `presets/runs/smollm2-notool-cpu.toml` — single-turn, the one-shot prompt works the sum in the
  answer.

Both arms score with `gsm8k` (acc only: 1 if the last `#### N` is the answer, else 0). Seeds are
`trainer.seed` = s (the sampler's and the trainer's randomness); `data.seed` stays 0, so every run sees the same
train prompts in the same order and validates on the same 32 held-out problems. Runs are interleaved seed by
seed (tool s, no tool s, tool s+1, …) so drift in the machine's load falls on both arms alike, each launched as
a user launches it (`benchmarks.demo_runs.launch`: its own process and local Ray, times from the command's
start). Per run: the greedy validation curve (`val-core/asyncrl/bigarith/acc/mean@1` at versions 0, 2 and 4 of
its 8 steps; version 0 is greedy and the same for every seed), the validation tool-call rate
(`asyncrl/val/tool_call_rate`: answers with at least one call), and per training step the mean reward
(`critic/rewards/mean`) and the tool calls per trajectory (`asyncrl/tools/calls_per_trajectory`).

Compared: the final validation accuracy (same steps and samples) per seed; the tool arm wins only when every
seed's final accuracy with the tool exceeds every seed's without it (`elastic_cores.beyond`: beyond the
spread, ≥ 3 seeds per arm). 32 problems give each accuracy a binomial ±0.08 besides the seeds' spread.
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
from benchmarks.elastic_cores import MIN_SEEDS, beyond, spread

STUDY = "tool-use"
BUDGET_S = 900.0
"""A wall budget also reported (seconds since launch): the tool arm's steps are longer (tool turns, latency)."""
TOOL, NO_TOOL = PRESETS / "smollm2-tools-cpu.toml", PRESETS / "smollm2-notool-cpu.toml"
TOY = ("rollout.total_rollout_steps=8", "trainer.test_freq=1", "data.val_max_samples=4", "rollout.n=4",
       "trainer.val_before_train=false")
SIZES: dict[str, dict[str, Any]] = {"full": {"seeds": [0, 1, 2], "overrides": ()},
                                    "toy": {"seeds": [0], "overrides": TOY}}


@dataclass(frozen=True)
class Arm:
    label: str
    preset: Path
    why: str


ARMS = [Arm("tool", TOOL, "multi-turn with the calculator"),
        Arm("no tool", NO_TOOL, "single-turn, same problems, steps, samples and reward")]


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
    spec = SIZES[size]
    result = new_result(STUDY, size, {"arms": [{"label": a.label, "preset": a.preset.name, "why": a.why} for a in ARMS],
                                      "seeds": spec["seeds"], "common_overrides": list(spec["overrides"]),
                                      "budget_s": BUDGET_S})
    from benchmarks.common import load_average

    runs: dict[str, dict[int, DemoRun]] = {a.label: {} for a in ARMS}
    series: dict[str, dict[str, list[float]]] = {}
    loads: dict[str, list[list[float]]] = {}
    with tempfile.TemporaryDirectory(prefix=f"asyncrl-{STUDY}-") as tmp:
        for seed in spec["seeds"]:
            for arm in ARMS:
                variant = Variant(f"{arm.label} s{seed}", (*spec["overrides"], f"trainer.seed={seed}"), arm.why)
                before = load_average()
                r = launch(variant, Path(tmp), timeout_s=2400, preset=arm.preset)
                loads[r.label] = [before, load_average()]
                series[r.label] = tool_series(Path(tmp) / variant.label.replace(" ", "-"))
                runs[arm.label][seed] = r
    flat = [r for by_seed in runs.values() for r in by_seed.values()]
    result["runs"] = [{**dict(r.__dict__), "final_acc": r.final_acc, **series[r.label],
                       "load_start_end": loads[r.label], "best_acc_by_budget": best_by(r, BUDGET_S)} for r in flat]
    finals = {label: [r.final_acc for r in by_seed.values() if not r.error and r.final_acc is not None]
              for label, by_seed in runs.items()}
    result["summary"] = {label: spread(v) for label, v in finals.items() if v}
    result["tables"] = [
        table("Tool vs no tool (SmolLM2-135M, bigarith, per seed)",
              ["run", "steps", "median step (s)", "launch to exit (s)", "greedy val at each validation",
               "val tool-call rate at each validation", "final val", f"best val by {BUDGET_S:.0f} s",
               "mean reward first → last 4 steps", "calls/trajectory first → last 4 steps", "load start → end"],
              [_row(r, series[r.label], loads[r.label]) for r in flat]),
        table("Final greedy val over seeds (32 problems)", ["arm", "seeds", "mean", "sd", "min", "max"],
              [[label, len(finals[label]), *(round(result["summary"][label][k], 4) for k in ("mean", "sd", "min", "max"))]
               for label in finals if finals[label]]),
        table("Validation curves (32 greedy problems)",
              ["run", "version", "seconds since launch", "greedy val acc", "val tool-call rate"],
              [[r.label, p["version"], p["time_s"], p["acc"], rate]
               for r in flat for p, rate in zip(r.curve, series[r.label]["val_tool_call_rate"] + [None] * 99)]),
    ]
    tool, none = finals["tool"], finals["no tool"]
    winner = beyond(tool, none)
    result["targets"] = [{
        "target": f"final greedy val: tool arm > no-tool arm in every seed pair beyond the spread (≥ {MIN_SEEDS} seeds)",
        "measured": [round(statistics.fmean(tool), 4) if tool else None, round(statistics.fmean(none), 4) if none else None],
        "op": ">", "goal": "no-tool arm",
        "status": "met" if winner == "a" else ("not met" if len(tool) >= MIN_SEEDS and len(none) >= MIN_SEEDS
                                              else "too few seeds")}]
    result["notes"] = [LAUNCH_NOTE, "A winner is named only when every tool seed's final val exceeds every no-tool "
                       "seed's (beyond the spread); 32 greedy problems carry about ±0.08 each."]
    write_json(finish_result(result, started), out_dir)
    plot(flat, series, out_dir)
    return result


def _row(r: DemoRun, s: dict[str, list[float]], load: list[list[float]]) -> list[Any]:
    if r.error:
        return [r.label, f"error: {r.error[:80]}"] + ["—"] * 9
    first, last = r.rewards[:4], r.rewards[-4:]
    cf, cl = s["calls_per_trajectory"][:4], s["calls_per_trajectory"][-4:]
    mean = statistics.fmean
    return [r.label, r.steps, round(r.median_step_s or 0.0, 1), r.launch_to_exit_s,
            " → ".join(f"{p['acc']:.2f}" for p in r.curve), " → ".join(f"{x:.2f}" for x in s["val_tool_call_rate"]),
            r.final_acc, best_by(r, BUDGET_S),
            f"{mean(first):.3f} → {mean(last):.3f}" if first else "—",
            f"{mean(cf):.2f} → {mean(cl):.2f}" if cf else "—",
            f"{load[0][0]:.2f} → {load[1][0]:.2f}"]


def plot(runs: list[DemoRun], series: dict[str, dict[str, list[float]]], out_dir: Path) -> Path:
    """Validation vs wall time, training reward per step, tool calls per trajectory per step."""
    from benchmarks.plots import pyplot, save

    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for r in (r for r in runs if not r.error):
        style = {"color": "C0" if r.label.startswith("tool") else "C1", "alpha": 0.8}
        axes[0].plot([p["time_s"] for p in r.curve], [p["acc"] for p in r.curve], marker="o", label=r.label, **style)
        axes[1].plot(range(1, len(r.rewards) + 1), r.rewards, label=r.label, **style)
        calls = series[r.label]["calls_per_trajectory"]
        axes[2].plot(range(1, len(calls) + 1), calls, label=r.label, **style)
    axes[0].axvline(BUDGET_S, color="grey", linestyle=":", linewidth=1)
    axes[0].set(xlabel="seconds since launch", ylabel="greedy val accuracy (32 problems)", ylim=(0, 1),
                title="validation vs wall time")
    axes[1].set(xlabel="step", ylabel="critic/rewards/mean", title="training reward")
    axes[2].set(xlabel="step", ylabel="asyncrl/tools/calls_per_trajectory", title="tool calls per trajectory")
    for ax in axes:
        ax.legend(fontsize=7)
    return save(fig, out_dir, STUDY)
