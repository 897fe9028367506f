"""Study 17 — tool sandbox overhead: the wall time of one trivial tool call through the bubblewrap box
(`engine.agent.sandbox.run_sandboxed`, as a run makes it) against the same call without the box (the same
runner in a plain subprocess: `isolation="none"`, what `allow_unsandboxed` falls back to) and the floor of any
subprocess-based tool (a bare `python -I -S -c pass`). Calls run one at a time, `N` of each, interleaved
(box, none, floor, box, …) so drifting load falls on all alike; median, p99 and max in ms.

Calls: `calculator("6*7")` (the smallest built-in) and `python("print(1)")` (the code interpreter, no
imports); the box overhead is box − none at the median. numpy / sympy imports are measured once each as an
aside (what a retool-style call that imports them pays on top, inside the box).
"""

from __future__ import annotations

import math
import subprocess
import time
from pathlib import Path
from typing import Any

from benchmarks.common import new_result, publish, table
from benchmarks.metrics import median
from benchmarks.plots import pyplot, save

STUDY = "sandbox-overhead"
CALLS = {"full": 50, "toy": 5}
CASES = {"calculator": ("engine.agent.builtin_tools:calculator", {"expression": "6*7"}),
         "python": ("engine.agent.builtin_tools:python", {"code": "print(1)"})}


def p99(values: list[float]) -> float:
    """The nearest-rank 99th percentile (the max below 100 samples)."""
    s = sorted(values)
    return s[max(0, math.ceil(0.99 * len(s)) - 1)]


def measure(n: int) -> dict[str, list[float]]:
    """Wall ms of `n` calls per (case, isolation), and of `n` bare interpreter starts."""
    from engine.agent.box import interpreter, unavailable_reason
    from engine.agent.sandbox import SandboxLimits, run_sandboxed

    if unavailable_reason() is not None:
        raise RuntimeError(f"no tool box here: {unavailable_reason()}")
    exe = interpreter()
    times: dict[str, list[float]] = {}
    limits = SandboxLimits(timeout_s=30)
    for _ in range(n):
        for case, (fn, args) in CASES.items():
            for isolation in ("box", "none"):
                t0 = time.perf_counter()
                out = run_sandboxed(fn, args, limits, isolation)  # type: ignore[arg-type]
                times.setdefault(f"{case}/{isolation}", []).append((time.perf_counter() - t0) * 1000)
                if not out.ok:
                    raise RuntimeError(f"{case} ({isolation}) failed: {out}")
        t0 = time.perf_counter()
        subprocess.run([exe, "-I", "-S", "-c", "pass"], check=True)
        times.setdefault("floor/python -I -S -c pass", []).append((time.perf_counter() - t0) * 1000)
    for mod in ("numpy", "sympy"):
        t0 = time.perf_counter()
        out = run_sandboxed(CASES["python"][0], {"code": f"import {mod}"}, limits)
        times[f"python import {mod}/box"] = [(time.perf_counter() - t0) * 1000]
        if not out.ok:
            raise RuntimeError(f"import {mod} failed in the box: {out}")
    return times


def run(size: str, out_dir: Path) -> dict[str, Any]:
    started = time.monotonic()
    n = CALLS[size]
    result = new_result(STUDY, size, {"calls": n})
    times = measure(n)
    rows = [{"name": k, "calls": len(v), "median_ms": median(v), "p99_ms": p99(v), "max_ms": max(v),
             "times_ms": v} for k, v in times.items()]
    result["rows"] = rows
    by = {r["name"]: r for r in rows}
    overhead = {case: by[f"{case}/box"]["median_ms"] - by[f"{case}/none"]["median_ms"] for case in CASES}
    result["overhead_ms"] = overhead
    result["tables"] = [table(
        f"Wall time of one tool call ({n} calls each, one at a time)",
        ["call", "calls", "median (ms)", "p99 (ms)", "max (ms)"],
        [[f"`{r['name']}`", r["calls"], round(r["median_ms"], 1), round(r["p99_ms"], 1), round(r["max_ms"], 1)]
         for r in rows])]
    result["notes"] = [
        "`box` = bubblewrap (new namespaces, read-only binds, tmpfs scratch, uid drop on a root host, rlimits); "
        "`none` = the same runner as a plain subprocess. Box overhead at the median: "
        + ", ".join(f"{c} {v:.1f} ms" for c, v in overhead.items()) + "."]
    return publish(result, started, out_dir, lambda: plot(rows, out_dir))


def plot(rows: list[dict[str, Any]], out_dir: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 3.8))
    shown = [r for r in rows if r["calls"] > 1]
    ax.boxplot([r["times_ms"] for r in shown], tick_labels=[r["name"] for r in shown])
    ax.set_ylabel("wall time per call (ms)")
    ax.tick_params(axis="x", labelsize=7)
    ax.set_title("Tool sandbox overhead", fontsize=10)
    return save(fig, out_dir, STUDY)
