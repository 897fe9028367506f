"""Fail when a source file is longer than the limit (run by `make lint` after ruff).

Limits, in lines: 450 for every `*.py` under engine/, asyncrl_cli/ and scripts/ (one responsibility per
module: a longer file is split by responsibility). Tests and benchmarks are not checked: a test file grows
with the cases of one behaviour, and a benchmark is one experiment end to end.

Usage: `python scripts/check_file_lengths.py [--limit N] [ROOT ...]` (default roots: engine asyncrl_cli
scripts, relative to the repository root). Prints each offender as `PATH: LINES lines (limit N)`, longest
first, and exits 1 when there is any; exits 0 silently otherwise.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

LIMIT = 450
ROOTS = ("engine", "asyncrl_cli", "scripts")
REPO = Path(__file__).resolve().parent.parent


def line_count(path: Path) -> int:
    """Lines as `wc -l` counts them, plus a last line without a newline."""
    data = path.read_bytes()
    return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)


def offenders(roots: list[Path], limit: int) -> list[tuple[Path, int]]:
    """`(path, lines)` of every `*.py` under `roots` longer than `limit`, longest first."""
    found = [(p, line_count(p)) for root in roots for p in sorted(root.rglob("*.py")) if p.is_file()]
    return sorted(((p, n) for p, n in found if n > limit), key=lambda pn: (-pn[1], str(pn[0])))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("roots", nargs="*", help=f"folders to check (default: {' '.join(ROOTS)})")
    parser.add_argument("--limit", type=int, default=LIMIT, help=f"most lines a file may have (default {LIMIT})")
    args = parser.parse_args(argv)
    roots = [Path(r) for r in args.roots] if args.roots else [REPO / r for r in ROOTS]
    missing = [str(r) for r in roots if not r.is_dir()]
    if missing:
        print(f"check_file_lengths: no such folder: {', '.join(missing)}", file=sys.stderr)
        return 2
    bad = offenders(roots, args.limit)
    for path, n in bad:
        shown = path.relative_to(REPO) if path.is_relative_to(REPO) else path
        print(f"{shown}: {n} lines (limit {args.limit}; split it by responsibility)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
