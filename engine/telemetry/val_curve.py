"""The validation curve of a finished run, read from its `metrics.jsonl` (printed by `asyncrl launch`, drawn
into the run's `report.md` by `engine.telemetry.run_report`).

A validation record carries `fully_async/count/current_param_version` (the weights validated),
`asyncrl/time` (seconds since the run started) and one `val-core/<data_source>/<metric>/mean@n` per data
source (n = `rollout.val_n` answers per prompt; the mean over every answer), where `<metric>` is `acc`
(exact answers) or, in runs written before that rename, `reward`; both are read. Pure functions over the standard library: the CLI imports them and stays light.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

VAL_PREFIX = "val-core/"
VAL_METRICS = ("acc", "reward")
"""The core variables, in order of preference."""
_CORE_MEAN = re.compile(r"^val-core/(?P<source>.+)/(?P<metric>acc|reward)/mean@(?P<n>\d+)$")
VERSION_KEY = "fully_async/count/current_param_version"
TIME_KEY = "asyncrl/time"
_STAMP = re.compile(r"\d{8}-\d{6}")


@dataclass(frozen=True)
class ValPoint:
    """One validation: the policy version, seconds since the run started, accuracy per data source."""

    version: int | None
    time_s: float | None
    accuracy: dict[str, float]
    n: int = 1
    """Answers per prompt the accuracy is the mean over (`mean@n`)."""


def core_accuracy_key(key: str) -> tuple[str, int, int] | None:
    """(data source, preference: 0 = acc, 1 = reward, n) of a `val-core/<source>/<metric>/mean@n` key, or None."""
    m = _CORE_MEAN.match(key)
    if m is None:
        return None
    return m["source"], VAL_METRICS.index(m["metric"]), int(m["n"])


def validation_curve(metrics_path: str | Path) -> list[ValPoint]:
    """Every validation record of `metrics_path` in file order (missing file or unreadable lines: skipped).
    A record holding both the `acc` and the `reward` key of a source reports `acc`."""
    path = Path(metrics_path)
    if not path.is_file():
        return []
    points: list[ValPoint] = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(rec, dict):
            continue
        best: dict[str, tuple[int, float]] = {}
        n = 1
        for key, value in rec.items():
            found = core_accuracy_key(key)
            if found is None or not isinstance(value, (int, float)) or isinstance(value, bool):
                continue
            source, rank, n = found
            if source not in best or rank < best[source][0]:
                best[source] = (rank, float(value))
        if not best:
            continue
        version = rec.get(VERSION_KEY)
        time_s = rec.get(TIME_KEY)
        points.append(ValPoint(
            version=int(version) if isinstance(version, (int, float)) else None,
            time_s=float(time_s) if isinstance(time_s, (int, float)) else None,
            accuracy={src: acc for src, (_, acc) in best.items()},
            n=n,
        ))
    return points


def _clock(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes}:{secs:02d}"


def format_validation_curve(points: list[ValPoint]) -> str:
    """A small table — version, wall time since launch (m:ss), accuracy per source — and the first → last
    change; "" when there was no validation. The title names `mean@n` when n > 1 answers per prompt."""
    if not points:
        return ""
    sources = sorted({src for p in points for src in p.accuracy})
    header = ["version", "wall"] + sources
    rows = [[str(p.version) if p.version is not None else "-", _clock(p.time_s)]
            + [f"{p.accuracy[s]:.3f}" if s in p.accuracy else "-" for s in sources] for p in points]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    ns = sorted({p.n for p in points})
    at = "" if ns == [1] else f" mean@{'/'.join(map(str, ns))}"
    lines = [f"validation accuracy (val-core{at}, per data source):"]
    lines += ["  " + "  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in [header, *rows]]
    for src in sources:
        seen = [p.accuracy[src] for p in points if src in p.accuracy]
        if len(seen) >= 2:
            lines.append(f"  {src}: {seen[0]:.3f} → {seen[-1]:.3f} ({seen[-1] - seen[0]:+.3f}) "
                         f"over {len(seen)} validations")
    return "\n".join(lines)


def written_run_dir(configured: str | Path) -> Path:
    """The directory the run wrote: `configured`, or — when that already held a run and the driver stamped
    a fresh one (`<name>-YYYYMMDD-HHMMSS`) — the sibling whose `metrics.jsonl` changed last."""
    base = Path(configured)
    stamped = base.parent.glob(f"{base.name}-*") if base.parent.is_dir() else []
    candidates = [base, *(d for d in stamped if _STAMP.fullmatch(d.name[len(base.name) + 1 :]))]
    with_metrics = [d for d in candidates if (d / "metrics.jsonl").is_file()]
    if not with_metrics:
        return base
    return max(with_metrics, key=lambda d: (d / "metrics.jsonl").stat().st_mtime)


def validation_summary(run_dir: str | Path) -> str:
    """`format_validation_curve` of `run_dir/metrics.jsonl`."""
    return format_validation_curve(validation_curve(Path(run_dir) / "metrics.jsonl"))


def show_validation_curve(exit_code: int, configured_run_dir: str | Path) -> None:
    """After a successful run (exit code 0), print its validation curve to stdout (nothing without one)."""
    if exit_code:
        return
    text = validation_summary(written_run_dir(configured_run_dir))
    if text:
        print(text, flush=True)
