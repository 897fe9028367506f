"""Chaos soak (`make soak`): the tiny preset in deterministic mode, fully async (staleness 0.5, a sync every 2
local steps), run for about `--minutes` while faults arrive at random times, then checked against a fault-free
run of the same config.

    python scripts/soak.py --minutes 30 [--seed S] [--out DIR]

Faults (from the first checkpoint on, each at a random moment 20-60 s after the previous, kind chosen at random;
`--seed` replays a schedule):

    replica      kill -9 of the rollout replica's process (the run replaces it)
    trainer      kill -9 of the trainer actor's process (the launch fails; `--resume auto` continues it)
    driver-term  SIGTERM to the driver (graceful stop with a checkpoint; `--resume auto` continues it)
    disk-full    the checkpoint directory's own tmpfs filled for 60 s (root only; a periodic checkpoint
                 then fails with an error event and the run goes on)

and every minute a live operator action: `asyncrl ctl RUN pause`, then `resume` 5 s later (the knob that
leaves a deterministic run's result unchanged). At the end: every prompt of the stream's prefix is in the
ledger exactly once, trained or dropped with a reason; the steps are contiguous; the final weights hash equals
the fault-free run's. The summary table (faults injected / survived) is printed and written to
`<out>/soak.json`. Exit 0 when every check holds.

Not covered (yet): multi-turn with a hanging tool, and a receiver killed exactly mid-transfer (a replica kill
lands in a sync only by chance).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ASYNCRL = Path(sys.executable).with_name("asyncrl")
TINY = REPO / "presets" / "runs" / "tiny-cpu.toml"
DETERMINISTIC = ("trainer.ppo_mini_batch_size=8", "trainer.ppo_micro_batch_size_per_gpu=16", "rollout.n=4",
                 "trainer.deterministic=true", "async_training.staleness_threshold=0.5",
                 "async_training.trigger_parameter_sync_step=2", "data.max_response_length=4",
                 "trainer.test_freq=0", "trainer.val_before_train=false", "logging.progress=false",
                 "checkpoint.every_versions=2", "checkpoint.keep_last=2")
STEP_S_GUESS = 0.45
"""Seconds per local step of the tiny deterministic run on two cores (to size `--minutes` into steps)."""


def sets(run_dir: Path, steps: int, name: str, ckpt_dir: Path | None) -> list[str]:
    out = [*DETERMINISTIC, f'logging.run_dir="{run_dir}"', f"rollout.total_rollout_steps={steps * 8}",
           f'name="{name}"']
    if ckpt_dir is not None:
        out.append(f'checkpoint.dir="{ckpt_dir}"')
    return out


def launch(overrides: list[str], log: Path, resume: bool = False) -> subprocess.Popen:
    args = [str(ASYNCRL), "launch", str(TINY)]
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


def soak(run_dir: Path, steps: int, rng: random.Random, disk: Path | None, log: Path) -> tuple[list[dict], int]:
    """Run with faults until the run ends (exit 0) or gives up; returns (faults, launches)."""
    name = "soak-run"
    overrides = sets(run_dir, steps, name, disk / "ckpt" if disk else None)
    proc, launches = launch(overrides, log), 1
    faults: list[dict] = []
    ckpts = (disk / "ckpt") if disk else run_dir / "checkpoints"
    while proc.poll() is None and not any(p.name.startswith("global_step_") for p in ckpts.glob("*")):
        time.sleep(0.2)  # faults start once a checkpoint exists: before it a trainer kill has nothing to resume
    next_fault = time.monotonic() + rng.uniform(5, 30)
    next_knob, full_until = time.monotonic() + 60, None
    kinds = ["replica", "trainer", "driver-term"] + (["disk-full"] if disk else [])
    while True:
        now = time.monotonic()
        if proc.poll() is not None:
            kill_session(proc.pid)
            if proc.returncode == 0 and final_hash(run_dir) is not None:
                break
            if launches > 40:
                raise RuntimeError(f"gave up after {launches} launches (last exit {proc.returncode}); see {log}")
            proc, launches = launch(overrides, log, resume=True), launches + 1
            continue
        if full_until is not None and now >= full_until:
            (disk / "ballast").unlink(missing_ok=True)
            full_until = None
        if now >= next_knob:
            ok = ctl(name, "pause")
            time.sleep(5)
            ok = ctl(name, "resume") and ok
            faults.append({"kind": "knob pause/resume", "step": len(trained_steps(run_dir)), "injected": ok})
            next_knob = time.monotonic() + 60
        if now >= next_fault:
            kind = rng.choice(kinds)
            step = len(trained_steps(run_dir))
            injected = True
            if kind in ("replica", "trainer"):
                pids = role_pids(proc.pid, kind)
                injected = bool(pids)
                for pid in pids:
                    os.kill(pid, signal.SIGKILL)
            elif kind == "driver-term":
                os.kill(proc.pid, signal.SIGTERM)
            elif kind == "disk-full" and full_until is None:
                fill(disk)
                full_until = time.monotonic() + 60
            faults.append({"kind": kind, "step": step, "injected": injected})
            next_fault = time.monotonic() + rng.uniform(20, 60)
            if kind in ("trainer", "driver-term"):  # the launch ends: wait for it (then `--resume auto`)
                try:
                    proc.wait(timeout=180)
                except subprocess.TimeoutExpired:
                    os.kill(proc.pid, signal.SIGKILL)
        time.sleep(0.5)
    if disk is not None:
        (disk / "ballast").unlink(missing_ok=True)
    return faults, launches


def ledger_exact(run_dir: Path, steps: int) -> str | None:
    """None when every ledger uid is unique, trained or dropped (with a reason) or in flight at the end, and
    steps × 8 prompts were trained; else what is wrong."""
    ledger = read_jsonl(run_dir / "ledger.jsonl")
    uids = [e["uid"] for e in ledger]
    if len(uids) != len(set(uids)):
        return "a prompt appears twice in the ledger"
    if any(e["status"] == "dropped" and not e.get("reason") for e in ledger):
        return "a dropped prompt without a reason"
    trained = sum(e["status"] == "trained" for e in ledger)
    return None if trained == steps * 8 else f"{trained} prompts trained, expected {steps * 8}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    seed = a.seed if a.seed is not None else time.time_ns() % 100_000
    out = a.out or Path(tempfile.mkdtemp(prefix="asyncrl-soak-"))
    out.mkdir(parents=True, exist_ok=True)
    steps = max(20, int(a.minutes * 60 / STEP_S_GUESS) // 2 * 2)
    log = out / "launches.log"
    t0 = time.monotonic()
    ref = out / "reference"
    rc = launch(sets(ref, steps, "soak-reference", None), log).wait()
    ref_s = time.monotonic() - t0
    if rc != 0:
        print(f"soak: the fault-free reference run failed (exit {rc}); see {log}")
        return 1
    disk = out / "disk"
    mounted = os.geteuid() == 0 and mount_tmpfs(disk, 64)
    t1 = time.monotonic()
    try:
        faults, launches = soak(out / "soak", steps, random.Random(seed), disk if mounted else None, log)
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(disk)], check=False)
    soak_s = time.monotonic() - t1
    run_dir = out / "soak"
    checks = {
        "steps contiguous": trained_steps(run_dir) == list(range(1, steps + 1)),
        "ledger exact": ledger_exact(run_dir, steps) is None,
        "final weights = fault-free run": final_hash(run_dir) == final_hash(ref) is not None,
    }
    errors = [e for e in read_jsonl(run_dir / "events.jsonl") if e["kind"] == "checkpoint" and e["level"] == "error"]
    summary = {"seed": seed, "steps": steps, "reference_s": round(ref_s), "soak_s": round(soak_s),
               "launches": launches, "disk_fault": mounted, "faults": faults, "checks": checks,
               "checkpoint_errors": len(errors), "ledger_problem": ledger_exact(run_dir, steps)}
    (out / "soak.json").write_text(json.dumps(summary, indent=2))
    print(f"soak: seed {seed}, {steps} steps, {soak_s / 60:.1f} min under faults ({launches} launches), "
          f"reference {ref_s / 60:.1f} min; {out}")
    print("| fault | drawn | injected | survived (run ended with every check holding) |")
    print("|---|---|---|---|")
    for kind in sorted({f["kind"] for f in faults}):
        got = [f for f in faults if f["kind"] == kind]
        hit = sum(f["injected"] for f in got)
        print(f"| {kind} | {len(got)} | {hit} | {hit if all(checks.values()) else 0} |")
    for name, ok in checks.items():
        print(f"check: {name}: {'ok' if ok else 'FAILED'}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
