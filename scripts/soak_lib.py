"""Process and record helpers of the chaos soak (`scripts/soak.py`): launching a run in a process session of its
own, finding and killing its processes, the operator's `ctl`, the soak's own tmpfs, and reading what a run wrote
(trained steps, the final weights hash, the ledger, the tool metrics, events).

A launch is `asyncrl launch PRESET --set ...` started with `start_new_session=True`, so its session id is the
driver's pid and every process of the run (Ray's workers included) is found by that session id in /proc — the
soak kills only what it started."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ASYNCRL = Path(sys.executable).with_name("asyncrl")


def launch(preset: Path, overrides: list[str], log: Path, resume: bool = False) -> subprocess.Popen:
    args = [str(ASYNCRL), "launch", str(preset)]
    for s in overrides:
        args += ["--set", s]
    if resume:
        args += ["--resume", "auto"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_USAGE_STATS_ENABLED": "0"}
    return subprocess.Popen(args, stdout=log.open("a"), stderr=subprocess.STDOUT, env=env, start_new_session=True)


def session_pids(sid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


def kill_session(sid: int) -> None:
    """SIGKILL what is left of a launch's process session (its own processes only)."""
    for _ in range(100):
        pids = session_pids(sid)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.2)


def role_pids(sid: int, role: str) -> list[int]:
    prefix = {"trainer": "ray::Trainer", "replica": "ray::RolloutReplica"}[role]
    out = []
    for pid in session_pids(sid):
        try:
            title = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
        except OSError:
            continue
        if title.startswith(prefix) and not title.startswith("ray::TrainerRank"):
            out.append(pid)
    return out


def processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line contains `text` (a tool box binds its tool file by path)."""
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                if text.encode() in (d / "cmdline").read_bytes():
                    found.append(int(d.name))
            except OSError:
                pass
    return found


def read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def ctl(name: str, *args: str) -> bool:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    try:
        return subprocess.run([str(ASYNCRL), "ctl", name, *args], capture_output=True, env=env,
                              timeout=30).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def mount_tmpfs(where: Path, size_mb: int) -> bool:
    where.mkdir(parents=True, exist_ok=True)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(where)],
                          capture_output=True).returncode == 0


def fill(disk: Path, leave: int = 1 << 20) -> None:
    with (disk / "ballast").open("wb") as f:
        f.write(b"\0" * max(0, shutil.disk_usage(disk).free - leave))


def trained_steps(run_dir: Path) -> list[int]:
    return [r["training/global_step"] for r in read_jsonl(run_dir / "metrics.jsonl") if "critic/rewards/mean" in r]


def final_hash(run_dir: Path) -> str | None:
    found = [e for e in read_jsonl(run_dir / "events.jsonl") if e["kind"] == "weights"]
    return found[-1]["weights_sha256"] if found else None


def tool_counts(run_dir: Path) -> dict[str, float]:
    """The training tool calls of the run's (final) step records: calls, timeouts, other errors, the slowest."""
    recs = read_jsonl(run_dir / "metrics.jsonl")
    out = {"calls": 0.0, "timeouts": 0.0, "errors": 0.0, "latency_max_s": 0.0}
    for r in recs:
        out["calls"] += r.get("asyncrl/tools/calls", 0)
        out["timeouts"] += r.get("asyncrl/tools/status/timeout", 0)
        out["errors"] += r.get("asyncrl/tools/errors", 0)
        out["latency_max_s"] = max(out["latency_max_s"], r.get("asyncrl/tools/latency_s/max", 0.0))
    return out


def ledger_exact(run_dir: Path, prompts: int) -> str | None:
    """None when every ledger uid is unique, trained or dropped (with a reason) or in flight at the end, and
    `prompts` prompts were trained; else what is wrong."""
    ledger = read_jsonl(run_dir / "ledger.jsonl")
    uids = [e["uid"] for e in ledger]
    if len(uids) != len(set(uids)):
        return "a prompt appears twice in the ledger"
    if any(e["status"] == "dropped" and not e.get("reason") for e in ledger):
        return "a dropped prompt without a reason"
    trained = sum(e["status"] == "trained" for e in ledger)
    return None if trained == prompts else f"{trained} prompts trained, expected {prompts}"


def recovery_after(run_dir: Path, t: float) -> str:
    """How the run got over a replica death at or after `t`: "checked" — the replacement came up in the same
    launch and a later weight sync (its catch-up broadcast or the next full sync) passed the delivery check on
    at least one replica; "resumed" — the launch ended before that (another fault) and a later launch went on;
    "none" — no death was recorded, or nothing came after it."""
    events = read_jsonl(run_dir / "events.jsonl")
    died = next((e["time"] for e in events if e["kind"] == "replica" and e.get("phase") == "restart"
                 and e["time"] >= t), None)
    if died is None:
        return "none"
    later = [e for e in events if e["time"] > died]
    end = next((e["time"] for e in later if e["kind"] == "start"), float("inf"))  # the next launch's start
    replaced = next((e["time"] for e in later if e["kind"] == "replica" and e.get("phase") == "replaced"
                     and e["time"] < end), None)
    if replaced is not None and any(e["kind"] == "sync" and replaced <= e["time"] < end and e.get("verified") == 1.0
                                    and e.get("replicas_verified", 0) >= 1 for e in later):
        return "checked"
    return "resumed" if end < float("inf") else "none"
