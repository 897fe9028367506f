"""Study 5 — CLI latency: wall time of `asyncrl --help`, `asyncrl validate` and `asyncrl launch --dry-run`
as a user sees it (a fresh process each time, interpreter start-up included); the median of N runs."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import PRESETS, new_result, publish, subprocess_env, table
from benchmarks.metrics import median
from benchmarks.plots import pyplot, save
from benchmarks.targets import evaluate

STUDY = "cli-latency"
REPEATS = {"full": 10, "toy": 1}
TARGETS_S = {"--help": 0.3, "validate": 0.6}


def asyncrl_exe() -> str:
    """The `asyncrl` console script next to this interpreter, else the one on PATH."""
    local = Path(sys.executable).parent / "asyncrl"
    if local.exists():
        return str(local)
    found = shutil.which("asyncrl")
    if not found:
        raise FileNotFoundError("the `asyncrl` console script is not installed (pip install -e .)")
    return found


def commands(run_dir: Path) -> dict[str, list[str]]:
    preset = str(PRESETS / "tiny-cpu.toml")
    return {
        "--help": ["--help"],
        "validate": ["validate", preset],
        "launch --dry-run": ["launch", preset, "--dry-run", "--set", f'logging.run_dir="{run_dir}"'],
    }


def time_command(argv: list[str], repeats: int) -> list[float]:
    """Wall seconds of `repeats` fresh runs of `argv` (each must exit 0)."""
    env = subprocess_env(1)
    env["COLUMNS"] = "120"
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
        times.append(time.perf_counter() - start)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()[-300:]}")
    return times


def run(size: str, out_dir: Path) -> dict[str, Any]:
    started = time.monotonic()
    repeats = REPEATS[size]
    exe = asyncrl_exe()
    result = new_result(STUDY, size, {"repeats": repeats, "executable": exe})
    rows = []
    with tempfile.TemporaryDirectory(prefix="asyncrl-bench-cli-") as tmp:
        time_command([exe, "--help"], 1)  # warm the page cache once, as a user's second call would be
        for name, args in commands(Path(tmp) / "run").items():
            times = time_command([exe, *args], repeats)
            rows.append(
                {
                    "name": name,
                    "argv": args,
                    "median_s": median(times),
                    "min_s": min(times),
                    "max_s": max(times),
                    "times_s": times,
                }
            )
    result["rows"] = rows
    result["tables"] = [
        table(
            "CLI wall time (fresh process each run)",
            ["command", f"median of {repeats} (s)", "min (s)", "max (s)"],
            [
                [
                    f"`asyncrl {r['name']}`",
                    round(r["median_s"], 3),
                    round(r["min_s"], 3),
                    round(r["max_s"], 3),
                ]
                for r in rows
            ],
        )
    ]
    by_name = {r["name"]: r for r in rows}
    result["targets"] = [
        evaluate(f"`asyncrl {n}`", round(by_name[n]["median_s"], 3), goal, "<=", "s")
        for n, goal in TARGETS_S.items()
    ]
    result["notes"] = [
        (
            "Each run is a new process: Python start-up, imports and the command itself. "
            "`launch --dry-run` targets the tiny preset and writes its config files to a temporary "
            "run directory."
        )
    ]
    return publish(result, started, out_dir, lambda: plot(rows, out_dir))


def plot(rows: list[dict[str, Any]], out_dir: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.8))
    ax.boxplot([r["times_s"] for r in rows], tick_labels=[f"asyncrl {r['name']}" for r in rows])
    for i, r in enumerate(rows, start=1):
        goal = TARGETS_S.get(r["name"])
        if goal is not None:
            ax.hlines(goal, i - 0.4, i + 0.4, colors="tab:red", linestyles="--")
    ax.set_ylabel("wall time (s)")
    ax.set_title("CLI latency (red: target)", fontsize=10)
    return save(fig, out_dir, STUDY)
