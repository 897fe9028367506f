"""Study — the demo as `make demo` runs it, three seeds, fully async and the same preset in `mode = "sync"`:
`asyncrl launch presets/runs/smollm2-arith-cpu.toml` with `trainer.seed` = 0, 1, 2, each seed as shipped
(fully async) and with `benchmarks.engine_runs.SYNC_OVERRIDES` (sync, staleness 0, no partial rollout: each
phase takes every core), interleaved seed by seed on the same cores (`benchmarks.demo_runs`: times from the
command's start, greedy validation of the 48 held-out problems at the same versions 0, 5 and 10 in both arms).

Issue 29's demo targets, read per seed on the shipped arm:

    launch to exit ≤ 480 s                     in every seed (`make demo` ≤ 8 minutes)
    best greedy val by 300 s after launch ≥ 0.78   in at least 2 of the 3 seeds
    fully async reaches greedy val 0.75 ≥ 1.25× sooner than sync: per seed, t_sync(0.75) ÷ t_async(0.75)
        (times since launch, at the first validation ≥ 0.75; a run that never reaches it counts as its
        launch-to-exit time, a lower bound), target on the median of the per-seed ratios

and a winner (launch to exit, time to 0.75) only when every seed of one arm lies beyond the other's whole
range (`benchmarks.elastic_cores.beyond`). (The first run of this study, at commit aa7c34e, compared elastic
cores on and off instead: no winner; its numbers stay in the commentary.)

Each run's `"auto"` choices (precision, threads, attention; `<run dir>/machine.json`) are recorded beside it:
they are this machine's, which is the point of the study.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import demo_runs
from benchmarks.common import finish_result, new_result, write_json
from benchmarks.engine_runs import SYNC_OVERRIDES
from benchmarks.demo_runs import (
    EARLY,
    EARLY_S,
    LAUNCH_NOTE,
    PRESET,
    DemoRun,
    Variant,
    curves_table,
    plot_runs,
    runs_table,
    to_json,
)
from benchmarks.targets import evaluate

STUDY = "demo-seeds"
DEMO_LIMIT_S = 480.0
"""`make demo` ≤ 8 minutes, launch to exit."""
SEEDS = {"full": (0, 1, 2), "toy": (0,)}
SHIPPED, SYNC = "shipped", "sync"
ARMS = {SHIPPED: (), SYNC: SYNC_OVERRIDES}
"""The preset as `make demo` runs it, and the same preset in sync mode."""
LEVEL = 0.75
"""Greedy validation level of the async ÷ sync target."""
ASYNC_MIN_SPEEDUP = 1.25
TOY = ("rollout.total_rollout_steps=4", "trainer.test_freq=1", "data.val_max_samples=4", "rollout.n=4",
       "data.max_response_length=16")


def variants(size: str) -> list[Variant]:
    extra = TOY if size == "toy" else ()
    return [Variant(f"{arm} seed {s}", (f"trainer.seed={s}", *more, *extra), f"the demo, {arm}, this seed")
            for s in SEEDS[size] for arm, more in ARMS.items()]


def chosen(run_dir: Path) -> dict[str, Any]:
    """The run's `"auto"` choices, key → value (empty when the run wrote no machine.json)."""
    try:
        record = json.loads((run_dir / "machine.json").read_text())
    except (OSError, ValueError):
        return {}
    return {c["key"]: c["value"] for c in record.get("choices", [])}


def arm(runs: list[DemoRun], name: str) -> list[DemoRun]:
    return [r for r in runs if r.label.startswith(name + " seed")]


def time_to_level(run: DemoRun) -> float:
    """Seconds from launch to the first greedy validation ≥ LEVEL; a run that never reached it: its launch to
    exit (a lower bound of the time it would have needed)."""
    return run.time_to(LEVEL) or run.launch_to_exit_s


def async_vs_sync(runs: list[DemoRun]) -> dict[str, Any]:
    """Per metric, each arm's values by seed and the winner beyond the spread; and per seed t_sync ÷ t_async to
    greedy val LEVEL (pairs of the same seed, both runs finished without error)."""
    from benchmarks.elastic_cores import beyond

    out: dict[str, Any] = {}
    for metric, value in (("launch_to_exit_s", lambda r: r.launch_to_exit_s), ("time_to_level_s", time_to_level)):
        shipped = [value(r) for r in arm(runs, SHIPPED) if not r.error]
        sync = [value(r) for r in arm(runs, SYNC) if not r.error]
        faster = beyond([-v for v in shipped], [-v for v in sync])  # lower is better
        out[metric] = {SHIPPED: shipped, SYNC: sync, "winner": {"a": SHIPPED, "b": SYNC}.get(faster or "", None)}
    pairs = zip(arm(runs, SHIPPED), arm(runs, SYNC))
    out["ratios"] = [round(time_to_level(s) / time_to_level(a), 3) for a, s in pairs if not a.error and not s.error]
    out["reached"] = {name: [r.time_to(LEVEL) is not None for r in arm(runs, name)] for name in (SHIPPED, SYNC)}
    return out


def targets(runs: list[DemoRun], ratios: list[float]) -> list[dict[str, Any]]:
    shipped = arm(runs, SHIPPED)
    ok = [r for r in shipped if not r.error]
    slowest = max((r.launch_to_exit_s for r in ok), default=None) if len(ok) == len(shipped) else None
    early = sum(1 for r in ok if (r.acc_at_or_before(EARLY_S) or 0.0) >= EARLY)
    return [
        evaluate("make demo launch to exit, slowest seed", slowest, DEMO_LIMIT_S, "<=", "s",
                 "a seed failed" if ok != shipped else ""),
        evaluate(f"seeds with greedy val ≥ {EARLY} within {EARLY_S:.0f} s of launch", early, 2, ">=", "of 3"),
        evaluate(f"sync ÷ fully async, time to greedy val {LEVEL} (median of seeds)",
                 statistics.median(ratios) if ratios else None, ASYNC_MIN_SPEEDUP, ">=", "×",
                 "" if len(ratios) == len(shipped) else "a pair failed"),
    ]


def run(size: str, out_dir: Path) -> dict[str, Any]:
    started = time.monotonic()
    chosen_variants = variants(size)
    result = new_result(STUDY, size, {"preset": PRESET.name, "variants": [
        {"label": v.label, "overrides": list(v.overrides), "why": v.why} for v in chosen_variants]})
    runs, rows = [], []
    with tempfile.TemporaryDirectory(prefix=f"asyncrl-{STUDY}-") as tmp:
        for v in chosen_variants:
            r = demo_runs.launch(v, Path(tmp), timeout_s=1800)
            runs.append(r)
            rows.append({**to_json(r), "auto": chosen(Path(tmp) / v.label.replace(" ", "-"))})
    result["runs"] = rows
    result["tables"] = [runs_table("The demo as `make demo` runs it (shipped) and in sync mode, per seed", runs),
                        curves_table(runs)]
    result["shipped_arm"] = SHIPPED
    result["async_vs_sync"] = compared = async_vs_sync(runs)
    result["targets"] = targets(runs, compared["ratios"])
    result["notes"] = [LAUNCH_NOTE, f"sync ÷ fully async time to greedy val {LEVEL}, per seed: " + ", ".join(
        f"{x}×" for x in compared["ratios"]) + "; winner beyond the spread: " + "; ".join(
        f"{m}: {compared[m]['winner'] or 'none'}" for m in ("launch_to_exit_s", "time_to_level_s")),
        "Auto choices per run: " + "; ".join(
        f"{r['label']}: " + ", ".join(f"{k} = {v}" for k, v in r["auto"].items()) for r in rows)]
    write_json(finish_result(result, started), out_dir)
    plot_runs(STUDY, runs, out_dir)
    return result
