"""`python -m benchmarks NAME|all|list|report` (also `asyncrl bench …`): run a study, all of them, or turn the
results into docs/benchmarks.md."""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from typing import Any

from benchmarks import STUDIES
from benchmarks.common import (
    QUIET_LOAD,
    RESULTS_DIR,
    annotate_json,
    default_out_dir,
    load_average,
    wait_for_quiet,
)


def run_study(
    name: str, size: str, out_dir: Path, max_load: float | None = None, wait_s: float = 0.0
) -> dict[str, Any]:
    """Run one study (after waiting up to `wait_s` for the 1-minute load to drop below `max_load`) and
    write `<out_dir>/<name>.json` and `.png`; returns the result."""
    if name not in STUDIES:
        raise KeyError(f"unknown study {name!r}; choose one of {', '.join(STUDIES)}")
    quiet = (
        wait_for_quiet(max_load, wait_s)
        if max_load is not None
        else {"waited_s": 0.0, "load": load_average(), "quiet": None}
    )
    module = importlib.import_module(STUDIES[name])
    result = module.run(size, out_dir)
    annotate_json(out_dir / f"{name}.json", {"quiet_wait": quiet})
    result["quiet_wait"] = quiet
    return result


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    p.add_argument("name", help=f"a study ({', '.join(STUDIES)}), 'all', 'list' or 'report'")
    p.add_argument("--toy", action="store_true", help="seconds-long toy size (the smoke test's)")
    p.add_argument("--size", default=None, help="a study's named size (e.g. rollout-throughput's `demo`)")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="results directory (default: benchmarks/results for full runs, a temporary directory for --toy)",
    )
    p.add_argument(
        "--max-load",
        type=float,
        default=None,
        help=f"wait for the 1-minute load average to drop below this first (suggested {QUIET_LOAD})",
    )
    p.add_argument(
        "--wait", type=float, default=600.0, help="longest wait for --max-load, seconds (then run anyway)"
    )
    p.add_argument(
        "--docs", type=Path, default=None, help="where `report` writes (default docs/benchmarks.md)"
    )
    p.add_argument(
        "--check", action="store_true",
        help="`report` only: write nothing; exit 1 if the page differs from what the results and notes give "
             "(a hand edit of the generated page would be lost at the next study: put it in benchmarks/notes/)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.name == "list":
        for name, module in STUDIES.items():
            print(f"{name:20s} {module}")
        return 0
    if args.name == "report":
        from benchmarks.report import stale_report, write_report

        if args.check:
            problem = stale_report(args.out or RESULTS_DIR, args.docs)
            if problem:
                print(problem, file=sys.stderr)
            return 1 if problem else 0
        path = write_report(args.out or RESULTS_DIR, args.docs)
        print(f"wrote {path}")
        return 0
    size = args.size or ("toy" if args.toy else "full")
    out_dir = args.out or default_out_dir(size)
    names = list(STUDIES) if args.name == "all" else [args.name]
    if any(n not in STUDIES for n in names):
        print(
            f"unknown study {args.name!r}; choose one of {', '.join(STUDIES)}, all, list, report",
            file=sys.stderr,
        )
        return 2
    for name in names:
        result = run_study(name, size, out_dir, args.max_load, args.wait)
        print(
            f"{name}: wrote {out_dir / (name + '.json')} and {name}.png "
            f"(load {result['load_before']} → {result['load_after']}, {result['study_wall_s']} s)"
        )
        for t in result["targets"]:
            print(
                f"  target {t['target']}: measured {t['measured']} (goal {t['op']} {t['goal']}) → {t['status']}"
            )
    if size == "full" and out_dir.resolve() == RESULTS_DIR.resolve():
        from benchmarks.report import write_report

        print(f"updated {write_report(out_dir, args.docs)}")
    return 0
