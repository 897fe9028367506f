"""Study — TRL side by side: TRL's `GRPOTrainer` (trl 1.16.0 in `.venv-trl`, CPU, fp32 and bf16 autocast)
against asyncrl (`mode = "sync"` and fully async) on the demo preset's recipe as the preset reads when the study
runs (`benchmarks.trl_spec.recipe_from_config`; the sync trigger is TRL's `steps_per_generation`).

Same model (the converted SmolLM2-135M-Instruct), same prompts (asyncrl's train stream, in its order, and
its greedy validation set), same n, prompts per step, max tokens, optimiser, lr, clipping and reward (the
project's scorer, `benchmarks.trl_spec.make_reward_adapter`), same number of steps, greedy validation at
the same steps. Each side is timed from its run's start (model loading included; asyncrl: from the start of
the `asyncrl launch` command, Ray start-up included, as a user's stopwatch reads it; TRL: just after the
worker's imports).

Reported per run:

    median step (s)       = median wall of one optimizer step (TRL: validation excluded; asyncrl:
                            `timing_s/step`, its median is not moved by the steps a validation lengthens)
    tokens/s              = Σ trained response tokens (EOS included) ÷ (end of the last step − end of
                            the first validation): the whole training, validations included on both sides
    sampling tokens/s     = TRL: Σ generated tokens ÷ Σ `generate` time; asyncrl: the replicas' generated
                            tokens ÷ the seconds they had a call out (`benchmarks.demo_runs`, "busy"), so
                            both are the sampler's own rate inside the training loop
    time to val ≥ 0.75    = the wall time of the first greedy validation at or above 0.75 (None: never)

and the target ratio  t_TRL(0.75) ÷ t_async(0.75)  (≥ 1.5 wanted), TRL at fp32 and at the demo trainer's
precision (`trainer.precision`; TRL's `bf16=True` is the same autocast over fp32 master weights).

Size `seeds` (issue 29's study at equal terms): for each of 3 seeds (`trainer.seed` = s on both sides; TRL's
`seed` is mapped from it), TRL in fp32, TRL in bf16 and asyncrl fully async as shipped, interleaved seed by seed.
Per TRL precision p and seed s the ratio t_TRL,p(0.75) ÷ t_async(0.75), a run that never reaches 0.75 counting
its whole wall (a lower bound); TRL's *best* precision is the one with the lower median time to 0.75, the
*equal* one is the precision asyncrl's trainer chose at launch (its `machine.json`). Targets on the median of
the seeds' ratios, the min…max beside them.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.config.precision import SHORT, policy_of
from benchmarks.common import PRESETS, REPO, finish_result, new_result, run_json_subprocess, sig, table, write_json
from benchmarks.demo_runs import EARLY, EARLY_S, FINAL, DemoRun, Variant
from benchmarks.demo_runs import launch as launch_demo
from benchmarks.engine_runs import SYNC_OVERRIDES, load_config
from benchmarks.plots import bars, pyplot, save
from benchmarks.targets import evaluate
from benchmarks.trl_spec import first_time_at, recipe_from_config

STUDY = "trl-grpo"
PRESET = "smollm2-arith-cpu.toml"
THRESHOLD = 0.75
TRL_VENV = REPO / ".venv-trl"
TRL_HINT = "TRL's venv is missing: run `make bench-trl-venv`"

SIZES: dict[str, dict[str, Any]] = {
    # The demo exactly: 20 steps of 4 prompts × 8, greedy validation of 48 prompts at 0, 5, 10, 15, 20.
    "full": {"overrides": [], "precisions": ["fp32", "bf16"], "timeout_s": 5400},
    # The smoke: 1 step of 4 prompts × 4, 16 tokens, 4 validation prompts at 0 and 1 — proves the pipeline
    # end to end on a loaded machine, measures nothing.
    # Issue 29's study at equal terms: 3 seeds × (TRL fp32, TRL bf16, asyncrl fully async as shipped).
    "seeds": {"overrides": [], "precisions": ["fp32", "bf16"], "timeout_s": 5400, "seeds": [0, 1, 2]},
    "toy": {
        "overrides": ["rollout.total_rollout_steps=4", "rollout.n=4", "data.max_response_length=16",
                      "data.val_max_samples=4", "trainer.test_freq=1"],
        "precisions": ["fp32", "bf16"],
        "timeout_s": 1800,
    },
}


def trl_python() -> Path | None:
    exe = TRL_VENV / "bin" / "python"
    return exe if exe.exists() else None


def build_spec(cfg: Any, work_dir: Path) -> dict[str, Any]:
    """The worker's input: the recipe, the model directory, and the prompts asyncrl would train on (the
    first `max_steps × prompts_per_step` of its epoch-0 stream) and validate on, with their token ids."""
    from engine.data.prompts import load_prompts, load_rows
    from engine.models.loader import load_tokenizer, resolve_model_path

    recipe = recipe_from_config(cfg)
    model_dir = resolve_model_path(cfg.model.path)
    tokenizer = load_tokenizer(cfg.model.path)
    out: dict[str, Any] = {**recipe, "model_dir": str(model_dir), "work_dir": str(work_dir)}
    for split, count in (("train", recipe["max_steps"] * recipe["prompts_per_step"]), ("val", None)):
        rows = load_rows(cfg.data, split)
        prompts, _ = load_prompts(cfg.data, tokenizer, split=split, epoch=0)
        chosen = prompts[:count] if count is not None else prompts
        out[split] = [
            {"prompt": rows[p.index].prompt, "prompt_ids": list(p.prompt_ids), "ground_truth": p.ground_truth,
             "data_source": p.data_source, "split": p.extra_info.get("split", split),
             "index": int(p.extra_info.get("index", p.index))}
            for p in chosen
        ]
    return out


def run_trl(spec_path: Path, precision: str, timeout_s: float, suffix: str = "") -> dict[str, Any]:
    """One TRL run in its own venv (all cores); `{"label", "error"}` when it cannot run or fails."""
    exe = trl_python()
    label = f"trl-{precision}{suffix}"
    if exe is None:
        return {"label": label, "error": TRL_HINT}
    res = run_json_subprocess([str(exe), "-m", "benchmarks.trl_worker", str(spec_path), precision],
                              threads=os.cpu_count() or 2, timeout_s=timeout_s)
    res["label"] = label  # the worker names its precision only; the seed's suffix is the study's
    return summarize_trl(res) if "error" not in res else res


def summarize_trl(res: dict[str, Any]) -> dict[str, Any]:
    """The worker's JSON reduced to the study's per-run numbers (see the module docstring)."""
    steps, points = res["steps"], res["validation"]
    start = points[0]["time_s"] if points and points[0]["step"] == 0 else steps[0]["time_s"] - steps[0]["step_s"]
    span = steps[-1]["time_s"] - start if steps else 0.0
    tokens = sum(s["tokens"] for s in steps)
    return {
        **res,
        "side": "trl",
        "n_steps": len(steps),
        "median_step_s": statistics.median(s["step_s"] for s in steps) if steps else None,
        "tokens": tokens,
        "tokens_per_s": tokens / span if span > 0 else None,
        "sampling_tokens_per_s": res.get("gen_tokens_per_s"),
        "curve": [{"step": p["step"], "time_s": p["time_s"], "acc": p["acc"]} for p in points],
        "time_to_threshold_s": first_time_at(points, THRESHOLD),
        "wall_s": res.get("wall_s"),
    }


def summarize_asyncrl(run: DemoRun) -> dict[str, Any]:
    """A finished asyncrl launch (`benchmarks.demo_runs`) reduced like `summarize_trl`."""
    if run.error:
        return {"label": run.label, "side": "asyncrl", "error": run.error}
    curve = [{"step": p["version"], "time_s": p["time_s"], "acc": p["acc"]} for p in run.curve]
    return {
        "label": run.label,
        "side": "asyncrl",
        "n_steps": run.steps,
        "median_step_s": run.median_step_s,
        "tokens": run.trained_tokens,
        "tokens_per_s": run.trained_tokens_per_s,
        "sampling_tokens_per_s": run.busy_tokens_per_s,
        "busy_tokens_per_s": run.busy_tokens_per_s,
        "rollout_output_tokens_per_s": run.sampling_tokens_per_s,
        "wall_s": run.launch_to_exit_s,
        "rewards": run.rewards,
        "mismatch": run.mismatch,
        "curve": curve,
        "time_to_threshold_s": first_time_at(curve, THRESHOLD),
        "best_val_by_early_s": run.acc_at_or_before(EARLY_S),
    }


def run_asyncrl(overrides: list[str], root: Path) -> list[dict[str, Any]]:
    """The demo preset in sync mode, then fully async, each launched as a user does (`asyncrl launch`, its own
    Ray) and timed from the command's start."""
    return [summarize_asyncrl(launch_demo(Variant(label, (*overrides, *extra)), root, timeout_s=3600))
            for label, extra in (("asyncrl-sync", SYNC_OVERRIDES), ("asyncrl-async", ()))]


def run_seeds(
    plan: dict[str, Any], work: Path, keep: Callable[[list[dict[str, Any]]], None] = lambda runs: None
) -> list[dict[str, Any]]:
    """Per seed: TRL at each precision, then asyncrl fully async as shipped (its "auto" choices kept);
    `keep(runs)` after every run, so an interrupted study leaves what it measured."""
    from benchmarks.demo_seeds import chosen

    runs: list[dict[str, Any]] = []
    for seed in plan["seeds"]:
        overrides = [*plan["overrides"], f"trainer.seed={seed}"]
        spec_path = work / f"spec-{seed}.json"
        spec_path.write_text(json.dumps(build_spec(load_config(PRESETS / PRESET, overrides), work)))
        for precision in plan["precisions"]:
            runs.append({**run_trl(spec_path, precision, plan["timeout_s"], f" seed {seed}"), "seed": seed})
            keep(runs)
        label = f"asyncrl-async seed {seed}"
        run = summarize_asyncrl(launch_demo(Variant(label, tuple(overrides)), work / "asyncrl", timeout_s=3600))
        runs.append({**run, "seed": seed, "auto": chosen(work / "asyncrl" / label.replace(" ", "-"))})
        keep(runs)
    return runs


def time_or_wall(run: dict[str, Any]) -> float | None:
    """Seconds to val THRESHOLD; a finished run that never got there: its whole wall (a lower bound)."""
    if not run or "error" in run:
        return None
    return run.get("time_to_threshold_s") or run.get("wall_s")


def seed_ratios(runs: list[dict[str, Any]], precisions: list[str], seeds: list[int]) -> dict[str, Any]:
    """Per TRL precision: t_TRL(THRESHOLD) ÷ t_async(THRESHOLD) by seed, median, min…max; and which precision is
    TRL's best (lower median time) and which equals asyncrl's trainer (from the fully async runs' choices)."""
    by = _by_label(runs)
    out: dict[str, Any] = {"ratios": {}, "median_time_s": {}}
    for p in precisions:
        ratios, times = [], []
        for s in seeds:
            trl, fast = time_or_wall(by.get(f"trl-{p} seed {s}", {})), time_or_wall(by.get(f"asyncrl-async seed {s}", {}))
            if trl is not None:
                times.append(trl)
            if trl is not None and fast:
                ratios.append(round(trl / fast, 3))
        out["ratios"][p] = ratios
        out["median_time_s"][p] = statistics.median(times) if times else None
    timed = {p: t for p, t in out["median_time_s"].items() if t is not None}
    out["best"] = min(timed, key=timed.__getitem__) if timed else None
    chose = {r.get("auto", {}).get("trainer.precision") for r in runs if r["label"].startswith("asyncrl-async")}
    out["equal"] = chose.pop() if len(chose) == 1 and None not in chose else None
    return out


def _seed_targets(compared: dict[str, Any], n_seeds: int) -> list[dict[str, Any]]:
    out = []
    for name in ("best", "equal"):
        p = compared[name]
        ratios = compared["ratios"].get(p, []) if p else []
        spread = f"per seed {', '.join(f'{x}×' for x in ratios)}" if ratios else ""
        why = "" if p and len(ratios) == n_seeds else ("a pair failed or is missing" if p else "no precision")
        out.append(evaluate(f"TRL at its {name} precision ({p or '—'}) time to val {THRESHOLD} ÷ asyncrl fully "
                            f"async's (median of seeds)", statistics.median(ratios) if ratios else None, 1.5, ">=",
                            "×", why or spread))
    return out


def run(size: str, out_dir: Path) -> dict[str, Any]:
    if trl_python() is None:  # without TRL there is nothing to compare: say so before 40 min of asyncrl runs
        raise SystemExit(f"trl-grpo: {TRL_HINT} (expected {TRL_VENV / 'bin' / 'python'})")
    started = time.monotonic()
    plan = SIZES[size]
    cfg = load_config(PRESETS / PRESET, plan["overrides"])
    recipe = recipe_from_config(cfg)
    result = new_result(STUDY, size, {"preset": PRESET, "overrides": plan["overrides"], "recipe": recipe,
                                      "precisions": plan["precisions"], "threshold": THRESHOLD})
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="asyncrl-trl-") as tmp:
        work = Path(tmp)
        if "seeds" in plan:
            partial = {**result, "study": f"{STUDY}.partial"}
            runs = run_seeds(plan, work, lambda done: write_json({**partial, "runs": done}, out_dir))
        else:
            spec_path = work / "spec.json"
            spec_path.write_text(json.dumps(build_spec(cfg, work)))
            for precision in plan["precisions"]:
                runs.append(run_trl(spec_path, precision, plan["timeout_s"]))
            runs += run_asyncrl(plan["overrides"], work / "asyncrl")
    result["runs"] = runs
    result["tables"] = _tables(runs)
    if "seeds" in plan:
        result["equal_terms"] = compared = seed_ratios(runs, plan["precisions"], plan["seeds"])
        result["targets"] = _seed_targets(compared, len(plan["seeds"]))
    else:
        result["targets"] = _targets(runs, SHORT[policy_of(cfg).compute])
    result["notes"] = _notes(runs, size, recipe)
    write_json(finish_result(result, started), out_dir)
    (out_dir / f"{STUDY}.partial.json").unlink(missing_ok=True)
    plot(runs, out_dir)
    return result


def _by_label(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["label"]: r for r in runs}


def _targets(runs: list[dict[str, Any]], trainer_precision: str) -> list[dict[str, Any]]:
    """TRL's time to val 0.75 over asyncrl fully async's (TRL at fp32 and at the demo trainer's precision),
    sync's over async's, and the demo's own targets, read off the fully async run."""
    by = _by_label(runs)
    fast, sync = by.get("asyncrl-async", {}), by.get("asyncrl-sync", {})
    out = []
    # "auto" (decided on the machine at launch, recorded in each run's machine.json): TRL at both precisions
    precisions = ["fp32", "bf16"] if trainer_precision == "auto" else ["fp32", trainer_precision]
    for precision in dict.fromkeys(precisions):
        trl = by.get(f"trl-{precision}", {})
        out.append(evaluate(f"TRL {precision} time to val {THRESHOLD} ÷ asyncrl fully async's",
                            _ratio(trl, fast), 1.5, ">=", "×", _why(trl, fast, "TRL")))
    for precision in dict.fromkeys(precisions):
        trl = by.get(f"trl-{precision}", {})
        mine, theirs = sync.get("busy_tokens_per_s"), trl.get("sampling_tokens_per_s")
        out.append(evaluate(f"hf sampler (asyncrl sync) ÷ TRL {precision} `generate`, tokens/s inside the loop",
                            round(mine / theirs, 3) if mine and theirs else None, 3.0, ">=", "×",
                            "run missing" if not (mine and theirs) else ""))
    out.append(evaluate(f"asyncrl sync time to val {THRESHOLD} ÷ fully async's", _ratio(sync, fast), 1.2, ">=",
                        "×", _why(sync, fast, "sync")))
    ok = bool(fast) and "error" not in fast
    last = fast["curve"][-1]["acc"] if ok and fast.get("curve") else None
    out += [
        evaluate(f"demo: best greedy val within {EARLY_S:.0f} s of launch", fast.get("best_val_by_early_s") if ok
                 else None, EARLY, ">=", "", "no fully async run"),
        evaluate("demo: last greedy val", last, FINAL, ">=", "", "no fully async run"),
        evaluate("demo: launch to exit", fast.get("wall_s") if ok else None, 480.0, "<=", " s", "no fully async run"),
    ]
    return out


def _ratio(slow: dict[str, Any], fast: dict[str, Any]) -> float | None:
    t_slow, t_fast = slow.get("time_to_threshold_s"), fast.get("time_to_threshold_s")
    return round(t_slow / t_fast, 3) if t_slow and t_fast else None


def _why(slow: dict[str, Any], fast: dict[str, Any], name: str) -> str:
    if not slow or not fast:
        return "run missing"
    if slow.get("error") or fast.get("error"):
        return (slow.get("error") or fast.get("error") or "")[:120]
    if fast.get("time_to_threshold_s") is None:
        return f"asyncrl fully async never reached {THRESHOLD}"
    if slow.get("time_to_threshold_s") is None:
        return (f"{name} never reached {THRESHOLD} in the same budget (asyncrl async did, at "
                f"{fast['time_to_threshold_s']:.0f} s)")
    return ""


def _fmt(value: Any, digits: int = 3) -> Any:
    return "—" if value is None else sig(float(value), digits)


def _tables(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows, curve_rows = [], []
    for r in runs:
        if "error" in r:
            rows.append([r["label"], "error: " + r["error"][:80], "—", "—", "—", "—", "—", "—"])
            continue
        accs = [p["acc"] for p in r["curve"] if p["acc"] is not None]
        rows.append([
            r["label"], r["n_steps"], _fmt(r["median_step_s"]), int(r["tokens"]), _fmt(r["tokens_per_s"]),
            _fmt(r["sampling_tokens_per_s"]), f"{accs[0]:.3f} → {accs[-1]:.3f}" if accs else "—",
            _fmt(r["time_to_threshold_s"], 4),
        ])
        curve_rows += [[r["label"], p["step"], _fmt(p["time_s"], 4), round(p["acc"], 3)] for p in r["curve"]]
    return [
        table("Runs (same recipe, same prompts, same number of steps)",
              ["run", "steps", "median step (s)", "trained tokens", "tokens/s (training)", "sampling tokens/s",
               "greedy val acc first → last", f"time to val ≥ {THRESHOLD} (s)"], rows),
        table("Validation curves", ["run", "step", "wall since start (s)", "greedy val acc"], curve_rows),
    ]


def _notes(runs: list[dict[str, Any]], size: str, recipe: dict[str, Any] | None = None) -> list[str]:
    notes = [
        "TRL runs `GRPOTrainer` with `shuffle_dataset=False` on asyncrl's train stream, `lr_scheduler_type="
        "'constant'`, `gradient_checkpointing=False` (TRL's default is on; it trades recompute for memory, which is not short here), "
        "`loss_type='dapo'` (token mean over the step's batch, as asyncrl's token-mean), `beta=0`.",
        "TRL's `bf16` is autocast over fp32 master weights (accelerate wraps `forward`, so sampling and "
        "validation compute in bf16 too); asyncrl runs the preset's precision in both of its modes "
        "(`rollout.dtype`, `trainer.precision`).",
    ]
    if recipe and recipe.get("filter_groups"):
        notes.append("asyncrl's preset samples dynamically (`algorithm.filter_groups`): a group whose answers all "
                     "scored alike is dropped and another prompt sampled, so each of its steps trains groups with "
                     "a gradient; TRL's `GRPOTrainer` has no such option and trains every group it sampled.")
    bad = [r["label"] for r in runs if r.get("prompt_ids_match") is False]
    if bad:
        notes.append(f"TRL rendered prompt token ids that differ from asyncrl's in {', '.join(bad)}.")
    if size == "toy":
        notes.append("Toy (smoke) size: 1 step of 4 prompts × 4 samples, 16 tokens, 4 validation prompts; "
                     "these numbers prove the harness runs end to end and measure nothing.")
    return notes


COLORS = {"trl-fp32": "tab:green", "trl-bf16": "tab:olive", "asyncrl-sync": "tab:blue",
          "asyncrl-async": "tab:orange"}


def plot(runs: list[dict[str, Any]], out_dir: Path) -> Path:
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    ok = [r for r in runs if "error" not in r]
    for r in ok:
        pts = [p for p in r["curve"] if p["time_s"] is not None and p["acc"] is not None]
        color = COLORS.get(r["label"].split(" seed ")[0])
        axes[0].plot([p["time_s"] for p in pts], [p["acc"] for p in pts], marker="o", color=color, label=r["label"])
        axes[1].plot([p["step"] for p in pts], [p["acc"] for p in pts], marker="o", color=color, label=r["label"])
    for ax, xlabel in ((axes[0], "wall time since the run's start (s)"), (axes[1], "step (policy version)")):
        ax.axhline(THRESHOLD, color="grey", linestyle="--", linewidth=1)
        ax.set(xlabel=xlabel, ylabel="greedy val accuracy", ylim=(0, 1))
        ax.legend(fontsize=8)
    axes[0].set_title("greedy validation vs wall time", fontsize=10)
    axes[1].set_title("greedy validation vs step", fontsize=10)
    bars(axes[2], [r["label"] for r in ok], [r["median_step_s"] or 0.0 for r in ok], ylabel="median step (s)",
         title="wall time per step", fmt="{:.1f}", colors=[COLORS.get(r["label"].split(" seed ")[0], "tab:grey") for r in ok])
    return save(fig, out_dir, STUDY)
