"""Study — the demo as `make demo` runs it, three seeds, with and without elastic cores:
`asyncrl launch presets/runs/smollm2-arith-cpu.toml` with `trainer.seed` = 0, 1, 2, each seed with elastic
cores (`resources.elastic_cores = true`) and with the fixed split (`= false`), interleaved seed by seed on the same
cores (`benchmarks.demo_runs`: times from the command's start, greedy validation of the 48 held-out problems
at the preset's versions).

Issue 29's demo targets, read per seed on the arm the preset ships:

    launch to exit ≤ 480 s                     in every seed (`make demo` ≤ 8 minutes)
    best greedy val by 300 s after launch ≥ 0.78   in at least 2 of the 3 seeds

and the lending's effect on the demo: launch to exit and median step, elastic vs fixed, a winner only when
every seed of one arm lies beyond the other's whole range (`benchmarks.elastic_cores.beyond`).

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
ARMS = {"elastic": ("resources.elastic_cores=true",), "fixed split": ("resources.elastic_cores=false",)}
"""Elastic cores on and off; both arms set it, so the comparison holds whatever the preset says. The targets
are read on the arm the preset ships (`shipped_arm`). (The first run of this study, at commit aa7c34e, named
the elastic arm "shipped": the preset had it on then.)"""


def shipped_arm() -> str:
    """The arm that is the demo as shipped: the preset's `resources.elastic_cores`."""
    from benchmarks.engine_runs import load_config

    return "elastic" if load_config(PRESET, []).resources.elastic_cores else "fixed split"
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


def lending(runs: list[DemoRun]) -> dict[str, Any]:
    """Elastic (shipped) vs fixed split per metric: the values per seed and the winner beyond the spread."""
    from benchmarks.elastic_cores import beyond

    out: dict[str, Any] = {}
    for metric in ("launch_to_exit_s", "median_step_s"):
        elastic = [getattr(r, metric) for r in arm(runs, "elastic") if not r.error and getattr(r, metric)]
        fixed = [getattr(r, metric) for r in arm(runs, "fixed split") if not r.error and getattr(r, metric)]
        faster = beyond([-v for v in elastic], [-v for v in fixed])  # lower is better
        out[metric] = {"elastic": elastic, "fixed split": fixed,
                       "winner": {"a": "elastic", "b": "fixed split"}.get(faster or "", None)}
    return out


def targets(runs: list[DemoRun], shipped: str) -> list[dict[str, Any]]:
    runs = arm(runs, shipped)
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
    result["tables"] = [runs_table("The demo as `make demo` runs it, with and without elastic cores, per seed", runs),
                        curves_table(runs)]
    result["shipped_arm"] = shipped_arm()
    result["targets"] = targets(runs, result["shipped_arm"])
    result["lending"] = lending(runs)
    result["notes"] = [LAUNCH_NOTE, "Elastic vs fixed split (winner only beyond the spread of the seeds): " + "; ".join(
        f"{m}: {v['winner'] or 'no winner'}" for m, v in result["lending"].items()), "Auto choices per run: " + "; ".join(
        f"{r['label']}: " + ", ".join(f"{k} = {v}" for k, v in r["auto"].items()) for r in rows)]
    write_json(finish_result(result, started), out_dir)
    plot_runs(STUDY, runs, out_dir)
    return result
