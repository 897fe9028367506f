"""Fail when `benchmarks/results/` holds more than one current JSON + PNG per study (run by `make lint`).

A study is a name of `benchmarks.STUDIES` (each writes `<name>.json` and `<name>.png`) or one of the studies
run on their own (`OTHER_STUDIES`: a module run with `python -m`, the GPU ladder's scripts). A file belongs to the study whose name is the longest prefix of its file name
followed by `.`, `-` or `_`, so `weight-sync-ab-2.json` is weight-sync's. Each study may keep only
`<name>.json` and `<name>.png` (at most two files); exploratory or superseded files stay in git history, not
in the tree. A file of no known study, and a folder, fail too (the results directory is flat).

Usage: `python scripts/check_results.py [DIR]` (default benchmarks/results of the repository). Prints each
problem on one line and exits 1 when there is any; exits 0 silently otherwise; 2 when DIR is not a folder.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
OTHER_STUDIES = {
    "master-weights": "python -m benchmarks.master_weights",
    "gpu_check": "scripts/gpu_check.py (the device ladder's bench rung)",
    "gpu_runtime_check": "scripts/gpu_runtime_check.py (the device ladder's rung 1)",
}
"""Results written beside the registry's studies by a study outside it (docs/benchmarks.md, docs/operations.md)."""
KEPT = (".json", ".png")


def study_names() -> list[str]:
    """Every study's name: the benchmark registry's (light: a dict, no study imported) and `OTHER_STUDIES`."""
    sys.path.insert(0, str(REPO))
    from benchmarks import STUDIES

    return sorted({*STUDIES, *OTHER_STUDIES})


def owner(file_name: str, studies: list[str]) -> str | None:
    """The study a result file belongs to: the longest name that is the file name's prefix up to `.`/`-`/`_`."""
    hits = [s for s in studies if file_name.startswith(s) and file_name[len(s):len(s) + 1] in (".", "-", "_")]
    return max(hits, key=len) if hits else None


def problems(results: Path, studies: list[str]) -> list[str]:
    """One line per file too many, file of no study, or folder in `results`."""
    out: list[str] = []
    by_study: dict[str, list[str]] = {}
    for path in sorted(results.iterdir()):
        if path.is_dir():
            out.append(f"{path.name}/: a folder (results are flat files: <study>.json and <study>.png)")
            continue
        study = owner(path.name, studies)
        if study is None:
            out.append(f"{path.name}: belongs to no study (benchmarks.STUDIES or scripts/check_results.py "
                       f"OTHER_STUDIES); keep it out of the tree")
            continue
        by_study.setdefault(study, []).append(path.name)
    for study, names in sorted(by_study.items()):
        extra = [n for n in names if n not in {study + ext for ext in KEPT}]
        if extra:
            out.append(f"{study}: {len(names)} files ({', '.join(names)}); keep only {study}.json and "
                       f"{study}.png (git history keeps the rest): git rm {' '.join(extra)}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", nargs="?", type=Path, default=RESULTS, help="results folder (default: %(default)s)")
    args = parser.parse_args(argv)
    if not args.dir.is_dir():
        print(f"check_results: no such folder: {args.dir}", file=sys.stderr)
        return 2
    found = problems(args.dir, study_names())
    for line in found:
        print(f"benchmarks/results: {line}" if args.dir == RESULTS else line)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
