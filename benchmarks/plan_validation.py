"""Study — plan validation: does `asyncrl plan` predict what a run then measures?

Part 1 (measured, this machine): calibrate on the tiny preset's sync run (`asyncrl plan --calibrate`),
predict its fully async run and a variant with another staleness and trigger, run both, and compare
samples/s (tolerance 15 %) and the trainer and rollouter idle ratios (tolerance 0.1), all over the steps
after the first three (`engine.predict.calibrate.measured`).

Part 2 (declared, no run): costs in the shape of verl's published 128-GPU H20 setups — the colocate
baseline's generation time fitted to the published one (the split of a decode step into a fixed and a
per-row part from `engine.predict.costs.estimate`), the trainer's time per version as published for the fully
async run, the published sync time — and the predicted async ÷ colocated set against the published speedup
(tolerance 25 %) and their ordering. A second prediction scales the colocate baseline's training time
linearly to the async trainer world, to show how much of the published gain that assumption misses.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import PRESETS, load_average, new_result, publish, sig, table
from benchmarks.targets import evaluate

STUDY = "plan-validation"
COMMON = ("trainer.test_freq=0", "trainer.val_before_train=false")
VARIANT = ("async_training.staleness_threshold=1.0", "async_training.trigger_parameter_sync_step=2")
SAME_THREADS = ("resources.trainer.cpu_threads=1", "resources.rollout.cpu_threads=1")
"""On CPU, sync mode gives each phase every core (2 OpenMP threads) and fully async one each: the sync
calibration run uses one thread per side too, so that its costs are those of the async runs' placement."""
SIZES = {"full": ("trainer.total_steps=120",),
         "toy": ("trainer.total_steps=8", "trainer.ppo_mini_batch_size=8", "rollout.n=4")}

# verl's README (docs/advance/fully_async.md, 2026-05-25), H20, 128 GPUs; seconds per version (512 prompts).
VERL = [
    {"name": "Qwen2.5-Math-7B 64:64, staleness 0.5", "preset": "qwen2.5-math-7b-dapo-fsdp2-64-64.toml",
     "overrides": (), "colo_gen": 177.85, "colo_train": 53.92 + 113.81, "async_train": 113.16, "sync": 0.12,
     "mean_response": 3000, "published": 2.35},
    {"name": "Qwen2.5-Math-7B 64:64, stream only (staleness 0)", "preset": "qwen2.5-math-7b-dapo-fsdp2-64-64.toml",
     "overrides": ("async_training.staleness_threshold=0.0",), "colo_gen": 177.85, "colo_train": 53.92 + 113.81,
     "async_train": 113.16, "sync": 0.12, "mean_response": 3000, "published": 1.6},
    {"name": "Qwen3-30B-A3B 96:32, staleness 0.5", "preset": "qwen3-30b-a3b-base-dapo-megatron-96-32.toml",
     "overrides": (), "colo_gen": 348.05, "colo_train": 497.89 - 348.05, "async_train": 206.63, "sync": 4.38,
     "mean_response": 2500, "published": 1.72},
]
VERL_SLOTS = 16
"""verl's rollouter sends each prompt on its own (`concurrent_samples_per_replica` = 16 at once) to servers
with continuous batching: a replica of 16 slots."""
TAIL = 0.02
"""Declared response lengths (verl publishes no histogram): 2 % run to the limit, the others uniform with the
case's declared `mean_response` overall."""


def _layout(preset: Path, overrides: list[str], device: str):
    from benchmarks.engine_runs import load_config
    from engine.predict.costs import Layout

    cfg = load_config(preset, overrides)
    return Layout.from_config(cfg, None, device)


def _compare(name: str, pred: Any, meas: dict[str, Any]) -> dict[str, Any]:
    err = pred.samples_per_s / meas["samples_per_s"] - 1
    dt = pred.trainer_idle_ratio - meas["trainer_idle_ratio"]
    dr = pred.rollout_idle_ratio - meas["rollout_idle_ratio"]
    return {"run": name, "predicted": pred.to_json(), "measured": meas, "samples_per_s_error": err,
            "trainer_idle_delta": dt, "rollout_idle_delta": dr,
            "within": abs(err) <= 0.15 and abs(dt) <= 0.1 and abs(dr) <= 0.1}


def measured_part(size: str, run_dirs: dict[str, Path] | None = None) -> dict[str, Any]:
    """Part 1. `run_dirs` (sync, async, variant): runs already made with the same overrides; else they are
    launched here."""
    from engine.predict.calibrate import calibrate, measured, read_rows
    from engine.predict.costs import resolve
    from engine.predict.prediction import simulate

    base = [*COMMON, *SIZES[size]]
    specs = {"sync": ("tiny-cpu-sync.toml", [*base, *SAME_THREADS]), "async": ("tiny-cpu.toml", base),
             "variant": ("tiny-cpu.toml", [*base, *VARIANT])}
    loads: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="asyncrl-plan-") as tmp:
        if run_dirs is None:
            from benchmarks.engine_runs import launch, ray_session

            run_dirs = {}
            with ray_session():
                for label, (preset, ov) in specs.items():
                    loads[label] = load_average()
                    launch(PRESETS / preset, ov, Path(tmp), label)
                    run_dirs[label] = Path(tmp) / label
        layouts = {k: _layout(PRESETS / p, ov, "cpu") for k, (p, ov) in specs.items()}
        cal = calibrate(run_dirs["sync"], layouts["sync"])
        out = {"calibration": cal, "loads_at_start": loads, "comparisons": []}
        for label in ("sync", "async", "variant"):
            lay = layouts[label]
            pred = simulate(lay, resolve(lay, calibration=cal), label)
            free = simulate(dataclasses.replace(lay, device="cuda"), resolve(lay, calibration=cal), label)
            c = _compare(label, pred, measured(read_rows(run_dirs[label]), lay))
            c["predicted_without_contention"] = free.to_json()
            own = calibrate(run_dirs[label], lay)  # the schedule alone: the run's own costs, re-simulated
            c["predicted_own_costs"] = simulate(lay, resolve(lay, calibration=own), label).to_json()
            c["own_costs"] = own["costs"]
            out["comparisons"].append(c)
    return out


def _fit_declared(case: dict[str, Any], slots: int = 1) -> dict[str, Any]:
    """Part 2 for one published setup: fit the decode cost to the colocate generation time, predict."""
    from benchmarks.engine_runs import load_config
    from engine.predict.costs import CostModel, estimate
    from engine.predict.prediction import colocated_layout, simulate
    from engine.plan.hardware import load_hardware
    from asyncrl_cli.config.hf_model import read_model_facts

    cfg = load_config(PRESETS / case["preset"], list(case["overrides"]))
    lay = dataclasses.replace(_layout(PRESETS / case["preset"], list(case["overrides"]), "cuda"), slots=slots)
    est, _ = estimate(lay, read_model_facts(cfg.model.path), load_hardware(cfg.resources.hardware))
    M = lay.max_new_tokens
    short = max(1, round(2 * (case["mean_response"] - TAIL * M) / (1 - TAIL) - 1))
    colo = colocated_layout(lay)
    per_step = case["colo_train"] / lay.trigger

    def costs(k: float, train_per_step: float, world: int) -> CostModel:
        return CostModel(est["decode_step_s"] * k, est["row_step_s"] * k, est["prefill_token_s"] * k, 0.0,
                         train_per_step, world, case["sync"], TAIL, short)

    k = 1.0
    for _ in range(3):  # the generation phase of the colocate baseline is linear in k
        p = simulate(colo, costs(k, per_step, colo.trainer_world), "colocated")
        gen = p.version_time_s - case["colo_train"] - case["sync"]
        k *= case["colo_gen"] / gen
    colo_p = simulate(colo, costs(k, per_step, colo.trainer_world), "colocated")
    fast = simulate(lay, costs(k, case["async_train"] / lay.trigger, lay.trainer_world), "async")
    linear = simulate(lay, costs(k, per_step, colo.trainer_world), "async (linear train scaling)")
    pred = colo_p.version_time_s / fast.version_time_s
    return {"case": case["name"], "published": case["published"], "predicted": pred,
            "predicted_linear_train": colo_p.version_time_s / linear.version_time_s,
            "error": pred / case["published"] - 1, "colocated_version_s": colo_p.version_time_s,
            "async_version_s": fast.version_time_s, "async_trainer_idle": fast.trainer_idle_ratio,
            "async_rollout_idle": fast.rollout_idle_ratio, "decode_scale": k,
            "decode_step_s": est["decode_step_s"] * k, "row_step_s": est["row_step_s"] * k,
            "inputs": {kk: case[kk] for kk in ("colo_gen", "colo_train", "async_train", "sync", "mean_response")},
            "slots": slots}


def run(size: str, out_dir: Path, run_dirs: dict[str, Path] | None = None) -> dict[str, Any]:
    started = time.monotonic()
    result = new_result(STUDY, size, {"common_overrides": list(COMMON), "size_overrides": list(SIZES[size]),
                                      "variant": list(VARIANT), "verl_cases": VERL, "declared_tail": TAIL,
                                      "verl_slots": VERL_SLOTS})
    part1 = measured_part(size, run_dirs)
    part2 = [_fit_declared(c, VERL_SLOTS) for c in VERL] if size == "full" else []
    result["measured"], result["declared"] = part1, part2
    rows = []
    for c in part1["comparisons"]:
        p, m = c["predicted"], c["measured"]
        rows.append([c["run"], sig(p["samples_per_s"]), sig(m["samples_per_s"]), f"{c['samples_per_s_error']:+.0%}",
                     round(p["trainer_idle_ratio"], 2), round(m["trainer_idle_ratio"], 2),
                     round(p["rollout_idle_ratio"], 2), round(m["rollout_idle_ratio"], 2),
                     sig(c["predicted_without_contention"]["samples_per_s"]), "yes" if c["within"] else "no",
                     sig(c["predicted_own_costs"]["samples_per_s"]),
                     round(c["predicted_own_costs"]["trainer_idle_ratio"], 2),
                     round(c["predicted_own_costs"]["rollout_idle_ratio"], 2),
                     round(c["own_costs"]["train_step_s"], 3)])
    result["tables"].append(table(
        "Predicted vs measured (tiny preset, this machine; calibrated on the sync run)",
        ["run", "pred. samples/s", "meas. samples/s", "error", "pred. trainer idle", "meas. trainer idle",
         "pred. rollout idle", "meas. rollout idle", "pred. samples/s, separate devices", "within tolerance",
         "own costs: pred. samples/s", "own costs: trainer idle", "own costs: rollout idle",
         "run's trainer s/step"],
        rows))
    result["tables"].append(table(
        "Declared costs in the shape of verl's published setups (H20, 128 GPUs)",
        ["setup", "published async ÷ colocate", "predicted", "error", "predicted, linear train scaling",
         "pred. async s/version", "pred. colocate s/version", "async trainer idle", "async rollout idle"],
        [[d["case"], d["published"], round(d["predicted"], 2), f"{d['error']:+.0%}",
          round(d["predicted_linear_train"], 2), round(d["async_version_s"], 1), round(d["colocated_version_s"], 1),
          round(d["async_trainer_idle"], 2), round(d["async_rollout_idle"], 2)] for d in part2]))
    for c in part1["comparisons"][1:]:
        result["targets"].append(evaluate(f"samples/s error ({c['run']})", round(abs(c["samples_per_s_error"]), 3),
                                          0.15, "<="))
    for d in part2:
        result["targets"].append(evaluate(f"async ÷ colocate error ({d['case']})", round(abs(d["error"]), 3),
                                          0.25, "<="))
    if len(part2) == len(VERL):
        order_pub = sorted(range(len(part2)), key=lambda i: part2[i]["published"])
        order_pred = sorted(range(len(part2)), key=lambda i: part2[i]["predicted"])
        result["targets"].append(evaluate("published ordering reproduced", order_pub == order_pred, True, "true"))
    result["notes"] = [
        "Part 1 runs: " + ("launched by the study" if run_dirs is None else
                           "made with `asyncrl launch` just before (see the commentary for the commands): "
                           + ", ".join(f"{k}={v}" for k, v in run_dirs.items())),
        "Samples are prompts (each with n responses), as in verl; all figures over the steps after the first 3.",
    ]
    return publish(result, started, out_dir, lambda: plot(result, out_dir))


def plot(result: dict[str, Any], out_dir: Path) -> Path:
    from benchmarks.plots import pyplot, save

    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4))
    comps = result["measured"]["comparisons"]
    x = range(len(comps))
    a.bar([i - 0.2 for i in x], [c["predicted"]["samples_per_s"] for c in comps], 0.4, label="predicted")
    a.bar([i + 0.2 for i in x], [c["measured"]["samples_per_s"] for c in comps], 0.4, label="measured")
    a.set_xticks(list(x), [c["run"] for c in comps])
    a.set(ylabel="trained prompts / s", title="tiny preset: plan vs run (this machine)")
    a.legend(fontsize=8)
    dec = result["declared"]
    y = range(len(dec))
    b.bar([i - 0.2 for i in y], [d["published"] for d in dec], 0.4, label="published (verl)")
    b.bar([i + 0.2 for i in y], [d["predicted"] for d in dec], 0.4, label="predicted")
    b.set_xticks(list(y), [d["case"].split(",")[0] + ("\nstream only" if "stream" in d["case"] else "")
                           for d in dec], fontsize=7)
    b.set(ylabel="async ÷ colocate", title="verl-shaped declared costs")
    b.legend(fontsize=8)
    return save(fig, out_dir, STUDY)


if __name__ == "__main__":  # reuse runs made with `asyncrl launch` and the same overrides
    import argparse

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--from-runs", nargs=3, type=Path, metavar=("SYNC", "ASYNC", "VARIANT"))
    ap.add_argument("--toy", action="store_true")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    a = ap.parse_args()
    dirs = dict(zip(("sync", "async", "variant"), a.from_runs)) if a.from_runs else None
    res = run("toy" if a.toy else "full", a.out, dirs)
    for t in res["tables"]:
        print(t["title"])
        for r in t["rows"]:
            print("  ", r)
    for t in res["targets"]:
        print(t)
