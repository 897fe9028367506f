"""Study — the demo as `make demo` runs it, three seeds: `asyncrl launch presets/runs/smollm2-arith-cpu.toml`
with only `trainer.seed` changed (0, 1, 2), one after the other on the same cores (`benchmarks.demo_runs`:
times from the command's start, greedy validation of the 48 held-out problems at versions 0, 5 and 10).

Issue 29's demo targets, read per seed:

    launch to exit ≤ 480 s                     in every seed (`make demo` ≤ 8 minutes)
    best greedy val by 300 s after launch ≥ 0.78   in at least 2 of the 3 seeds

Each run's `"auto"` choices (precision, threads, attention; `<run dir>/machine.json`) are recorded beside it:
they are this machine's, which is the point of the study.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import demo_runs
from benchmarks.common import finish_result, new_result, write_json
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
TOY = ("rollout.total_rollout_steps=4", "trainer.test_freq=1", "data.val_max_samples=4", "rollout.n=4",
       "data.max_response_length=16")


def variants(size: str) -> list[Variant]:
    extra = TOY if size == "toy" else ()
    return [Variant(f"seed {s}", (f"trainer.seed={s}", *extra), "the shipped demo, this seed")
            for s in SEEDS[size]]


def chosen(run_dir: Path) -> dict[str, Any]:
    """The run's `"auto"` choices, key → value (empty when the run wrote no machine.json)."""
    try:
        record = json.loads((run_dir / "machine.json").read_text())
    except (OSError, ValueError):
        return {}
    return {c["key"]: c["value"] for c in record.get("choices", [])}


def targets(runs: list[DemoRun]) -> list[dict[str, Any]]:
    ok = [r for r in runs if not r.error]
    slowest = max((r.launch_to_exit_s for r in ok), default=None) if len(ok) == len(runs) else None
    early = sum(1 for r in ok if (r.acc_at_or_before(EARLY_S) or 0.0) >= EARLY)
    return [
        evaluate("make demo launch to exit, slowest seed", slowest, DEMO_LIMIT_S, "<=", "s",
                 "a seed failed" if ok != runs else ""),
        evaluate(f"seeds with greedy val ≥ {EARLY} within {EARLY_S:.0f} s of launch", early, 2, ">=", "of 3"),
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
    result["tables"] = [runs_table("The demo as `make demo` runs it, per seed", runs), curves_table(runs)]
    result["targets"] = targets(runs)
    result["notes"] = [LAUNCH_NOTE, "Auto choices per seed: " + "; ".join(
        f"{r['label']}: " + ", ".join(f"{k} = {v}" for k, v in r["auto"].items()) for r in rows)]
    write_json(finish_result(result, started), out_dir)
    plot_runs(STUDY, runs, out_dir)
    return result
