"""Launch the SmolLM2 demo the way a user does (`asyncrl launch presets/runs/smollm2-arith-cpu.toml --set …`,
one process per run, its own local Ray) and reduce each run to what the precision study and the demo sweep
compare. Times are wall seconds from the launch command's start, as a user's stopwatch reads them (Ray start-up
and model loading included):

    t_val(k)            = epoch of the k-th `validation` event in events.jsonl − epoch before the launch
    time to acc ≥ a     = t_val of the first greedy validation at or above a (None: never)
    launch to exit      = the launch command's wall time
    median step (s)     = median of `timing_s/step`
    sampling tokens/s   = mean of `asyncrl/rollout/tokens_per_s` (what the rollouter generated per wall second)
    busy tokens/s       = Σ_k tokens_per_s_k · Δt_k ÷ Σ_k `fully_async/rollouter/active_time`_k: the tokens the
                          replicas generated (Δt_k = the `asyncrl/time` between step reports) per second that a
                          replica had a call out — the sampler's own rate inside the loop, validation included
    trained tokens/s    = Σ `actor/response_tokens` ÷ (last step's `asyncrl/time` − first validation's)
    mismatch            = means over the steps of verl's `rollout_corr/*` diagnostics of π_rollout against the
                          trainer's log-probs of the same tokens: kl = E[log π_rollout − log π_train] (k1),
                          ppl_ratio = exp(mean log-ppl difference), chi2_token = E[ρ²] − 1, and the share of
                          tokens rejection sampling masked (`rollout_rs_masked_fraction`, 0 when RS is off)
"""

from __future__ import annotations

import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common import PRESETS, REPO, new_result, subprocess_env
from benchmarks.engine_runs import read_jsonl

PRESET = PRESETS / "smollm2-arith-cpu.toml"
EARLY, EARLY_S, FINAL = 0.78, 300.0, 0.88
"""The issue's demo targets: greedy validation ≥ 0.78 within 5 minutes of launch and ≥ 0.88 by the end."""
LAUNCH_NOTE = ("Each run is `asyncrl launch presets/runs/smollm2-arith-cpu.toml --set …` in its own process (its "
               "own local Ray), timed from the command's start; the variants ran one after the other on the same cores.")
KEEP_ENV = "ASYNCRL_BENCH_RUNS"
"""Where each launched run's records are kept after its study: `$ASYNCRL_BENCH_RUNS`, default `runs/bench/` in the
repository (not committed), one directory per run named by its UTC start and label (`keep_records`)."""
RECORDS = ("metrics.jsonl", "events.jsonl", "ledger.jsonl", "config.resolved.json", "config.provenance.json",
           "machine.json", "run.json", "run.log")
"""A run directory's records — everything but its checkpoints (1.6 GB for the demo)."""
MISMATCH = ("kl", "ppl_ratio", "chi2_token", "rollout_rs_masked_fraction", "rollout_is_mean")


@dataclass(frozen=True)
class Variant:
    """One run of the demo: a label, the `--set` overrides on top of the preset, and why it is in the study."""

    label: str
    overrides: tuple[str, ...] = ()
    why: str = ""


@dataclass
class DemoRun:
    label: str
    overrides: list[str]
    exit_code: int
    launch_to_exit_s: float
    steps: int = 0
    median_step_s: float | None = None
    sampling_tokens_per_s: float | None = None
    busy_tokens_per_s: float | None = None
    trained_tokens: float = 0.0
    trained_tokens_per_s: float | None = None
    curve: list[dict[str, Any]] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    mismatch: dict[str, float] = field(default_factory=dict)
    filtered_groups: int = 0
    """Groups dynamic sampling dropped (`asyncrl/count/filtered_groups` at the last step; 0 when it is off)."""
    error: str | None = None
    records: str | None = None
    """Where the run's records were kept (`keep_records`), relative to the repository."""

    def acc_at_or_before(self, seconds: float) -> float | None:
        """The best greedy validation reached by `seconds` after launch (None: no validation by then)."""
        accs = [p["acc"] for p in self.curve if p["time_s"] <= seconds]
        return max(accs) if accs else None

    def time_to(self, threshold: float) -> float | None:
        return next((p["time_s"] for p in self.curve if p["acc"] >= threshold), None)

    @property
    def final_acc(self) -> float | None:
        return self.curve[-1]["acc"] if self.curve else None


def launch(variant: Variant, root: Path, timeout_s: float, preset: Path = PRESET) -> DemoRun:
    """`asyncrl launch` `preset` (the demo's by default) with `variant.overrides` in a subprocess (all cores)
    and summarise it."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", variant.label)  # "lr 4e-5" → "lr-4e-5", "bf16+rc" → "bf16-rc"
    run_dir = root / slug
    exe = Path(sys.executable).parent / "asyncrl"  # the CLI of the environment running the study
    argv = [str(exe if exe.exists() else "asyncrl"), "launch", str(preset), "--set", f'logging.run_dir="{run_dir}"',
            "--set", f'name="bench-{slug}"']
    for o in variant.overrides:
        argv += ["--set", o]
    env = subprocess_env(os.cpu_count() or 2)
    env.pop("OMP_NUM_THREADS")  # the preset's placement chooses the threads, as in `make demo`
    t0 = time.time()
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, env=env, cwd=str(REPO),
                              check=False)
        code, tail = proc.returncode, (proc.stderr or proc.stdout).strip().splitlines()[-1:]
    except subprocess.TimeoutExpired:
        code, tail = 124, [f"timed out after {timeout_s:.0f} s"]
    out = summarize(variant, run_dir, t0, code, time.time() - t0)
    print(f"{variant.label}: exit {code} after {out.launch_to_exit_s:.0f} s, val {[p['acc'] for p in out.curve]}",
          file=sys.stderr, flush=True)
    if code != 0:
        out.error = f"exit {code}: {tail[0][:200] if tail else 'no output'}"
    kept = Path(os.environ.get(KEEP_ENV) or REPO / "runs" / "bench")
    out.records = keep_records(run_dir, kept / f"{time.strftime('%Y-%m-%dT%H%M%S', time.gmtime(t0))}-{slug}")
    return out


def keep_records(run_dir: Path, dest: Path) -> str | None:
    """Copy `run_dir`'s records (`RECORDS`, not its checkpoints) to `dest`, so a study's runs can be read after
    its temporary directory is gone; returns `dest` relative to the repository (None: nothing to keep)."""
    found = [run_dir / name for name in RECORDS if (run_dir / name).is_file()]
    if not found:
        return None
    dest.mkdir(parents=True, exist_ok=True)
    for path in found:
        shutil.copy2(path, dest / path.name)
    return str(dest.relative_to(REPO)) if dest.is_relative_to(REPO) else str(dest)


def run_variants(study: str, size: str, variants: list[Variant]) -> tuple[dict[str, Any], list[DemoRun]]:
    """A study's result skeleton (`new_result`, listing the variants) and every variant launched in turn."""
    result = new_result(study, size, {"preset": PRESET.name, "variants": [
        {"label": v.label, "overrides": list(v.overrides), "why": v.why} for v in variants]})
    with tempfile.TemporaryDirectory(prefix=f"asyncrl-{study}-") as tmp:
        runs = [launch(v, Path(tmp), timeout_s=1800) for v in variants]
    return result, runs


def val_accuracy(record: dict[str, Any]) -> float:
    """A validation record's greedy accuracy: `val-core/<source>/acc/mean@1`, or the reward's mean where the scorer
    returns a plain score (`gsm8k`: 1 right / 0 wrong, so its reward is its accuracy)."""
    for suffix in ("/acc/mean@1", "/reward/mean@1"):
        found = [v for k, v in record.items() if k.startswith("val-core/") and k.endswith(suffix)]
        if found:
            return float(found[0])
    raise ValueError(f"no val-core accuracy in {sorted(record)}")


def summarize(variant: Variant, run_dir: Path, t0: float, code: int, wall_s: float) -> DemoRun:
    """A finished run directory reduced to a `DemoRun` (formulas in the module docstring)."""
    records = read_jsonl(run_dir / "metrics.jsonl")
    events = [e for e in read_jsonl(run_dir / "events.jsonl") if e.get("kind") == "validation"]
    vals = [r for r in records if any(k.startswith("val-core/") for k in r)]
    train = [r for r in records if "critic/rewards/mean" in r]
    run = DemoRun(variant.label, list(variant.overrides), code, round(wall_s, 1), steps=len(train))
    for rec, ev in zip(vals, events):
        acc = val_accuracy(rec)
        run.curve.append({"version": int(rec.get("fully_async/count/current_param_version", 0)),
                          "time_s": round(float(ev["time"]) - t0, 1), "acc": round(float(acc), 4)})
    if not train:
        return run
    run.rewards = [round(float(r["critic/rewards/mean"]), 4) for r in train]
    run.filtered_groups = int(max(float(r.get("asyncrl/count/filtered_groups", 0)) for r in train))
    run.median_step_s = statistics.median(float(r["timing_s/step"]) for r in train)
    tps = [float(r["asyncrl/rollout/tokens_per_s"]) for r in train if "asyncrl/rollout/tokens_per_s" in r]
    run.sampling_tokens_per_s = statistics.fmean(tps) if tps else None
    times = [0.0] + [float(r["asyncrl/time"]) for r in train]
    generated = sum(float(r.get("asyncrl/rollout/tokens_per_s", 0.0)) * (t1 - t0)
                    for r, t0, t1 in zip(train, times, times[1:]))
    active = sum(float(r.get("fully_async/rollouter/active_time", 0.0)) for r in train)
    run.busy_tokens_per_s = generated / active if active > 0 else None
    start = float(vals[0]["asyncrl/time"]) if vals else 0.0
    span = float(train[-1]["asyncrl/time"]) - start
    tokens = sum(float(r.get("actor/response_tokens", 0.0)) for r in train)
    run.trained_tokens = tokens
    run.trained_tokens_per_s = tokens / span if span > 0 else None
    for name in MISMATCH:
        values = [float(r[f"rollout_corr/{name}"]) for r in train if f"rollout_corr/{name}" in r]
        if values:
            run.mismatch[name] = statistics.fmean(values)
    return run


def to_json(run: DemoRun) -> dict[str, Any]:
    out = dict(run.__dict__)
    out.update(time_to_early=run.time_to(EARLY), acc_by_early_s=run.acc_at_or_before(EARLY_S),
               time_to_final=run.time_to(FINAL), final_acc=run.final_acc)
    return out


def runs_table(title: str, runs: list[DemoRun]) -> dict[str, Any]:
    """One row per run: speed, the validation curve's landmarks and the mismatch."""
    rows = []
    for r in runs:
        if r.error:
            rows.append([r.label, f"error: {r.error[:80]}"] + ["—"] * 9)
            continue
        accs = " → ".join(f"{p['acc']:.2f}" for p in r.curve)
        mm = r.mismatch
        rows.append([
            r.label, _f(r.median_step_s), _f(r.busy_tokens_per_s), _f(r.trained_tokens_per_s), accs,
            _f(r.acc_at_or_before(EARLY_S)), _f(r.time_to(EARLY)), _f(r.launch_to_exit_s),
            _f(mm.get("kl"), 2), _f(mm.get("ppl_ratio"), 4), _f(mm.get("rollout_rs_masked_fraction"), 2),
        ])
    return {"title": title, "columns": [
        "run", "median step (s)", "sampler busy tok/s", "trained tok/s", "greedy val at each validation",
        f"best val by {EARLY_S:.0f} s", f"time to {EARLY} (s)", "launch to exit (s)", "rollout_corr/kl",
        "rollout_corr/ppl_ratio", "RS masked"], "rows": rows}


def curves_table(runs: list[DemoRun]) -> dict[str, Any]:
    rows = [[r.label, p["version"], p["time_s"], p["acc"]] for r in runs for p in r.curve]
    return {"title": "Validation curves (48 greedy prompts)",
            "columns": ["run", "version", "seconds since launch", "greedy val acc"], "rows": rows}


def _f(value: float | None, digits: int = 3) -> Any:
    if value is None:
        return "—"
    return float(f"{value:.{digits}g}")


def plot_runs(study: str, runs: list[DemoRun], out_dir: Path) -> Path:
    """Greedy validation against seconds since launch, training reward against step, median step time."""
    from benchmarks.plots import bars, pyplot, save

    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    ok = [r for r in runs if not r.error]
    for r in ok:
        axes[0].plot([p["time_s"] for p in r.curve], [p["acc"] for p in r.curve], marker="o", label=r.label)
        axes[1].plot(range(1, len(r.rewards) + 1), r.rewards, label=r.label)
    axes[0].axhline(EARLY, color="grey", linestyle="--", linewidth=1)
    axes[0].axvline(EARLY_S, color="grey", linestyle=":", linewidth=1)
    axes[0].set(xlabel="seconds since launch", ylabel="greedy val accuracy (48 prompts)", ylim=(0, 1),
                title="validation vs wall time")
    axes[1].set(xlabel="step", ylabel="critic/rewards/mean", ylim=(0, 1), title="training reward")
    for ax in axes[:2]:
        ax.legend(fontsize=7)
    bars(axes[2], [r.label for r in ok], [r.median_step_s or 0.0 for r in ok], ylabel="median step (s)",
         title="wall time per step", fmt="{:.1f}")
    return save(fig, out_dir, study)
