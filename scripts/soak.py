"""Chaos soak (`make soak`): tiny runs, fully async (staleness 0.5, a sync every 2 local steps), under faults
arriving at random times; the deterministic arm is then checked against a fault-free run of the same config.

    python scripts/soak.py --minutes 30 [--seed S] [--out DIR] [--arms single,multi] [--faults KIND,...]

Two arms; `--minutes` is the whole soak's wall-clock plan, split evenly between them. Each arm's share is spent
on a short fault-free probe of its config (`PROBE_STEPS` steps: the launch's start-up and the seconds per local
step on this machine *now*, the mean of the trainer's `timing_s/step`), then (single) the fault-free reference
run, then the faulted run; its length in steps is sized from the probe so that all of it fits the share (`plan`:
the faulted run's start-ups and the pause/resume knob counted as overhead). Faults and knob actions are injected
only until the share's end; after it the run is let to finish (no more faults), so the soak overruns its plan by
at most the rest of a run. The summary prints the minutes planned and taken, per arm and in all.

    single  the tiny preset (presets/runs/tiny-cpu.toml), single-turn, in deterministic mode; a fault-free
            reference run of the same config comes first
    multi   the tiny tool preset (presets/runs/tiny-tools-cpu.toml), multi-turn, with its `lookup` tool replaced
            by `scripts/soak_hang_tool.py`: for a quarter of the prompts the tool never returns, the bubblewrap
            box (engine/agent/box.py) kills it at its 2 s deadline and the model reads a `timeout` error answer;
            the table counts those timeouts. Deterministic mode refuses multi-turn (tool latencies decide when a
            turn is generated), so this arm has no reference run and no weights comparison

Faults (from the first checkpoint on until the arm's share of `--minutes` ends, each at a random moment 20-60 s
after the previous; the kinds come as a
shuffled bag, every kind once before any repeats; `--seed` replays a schedule, `--faults` restricts the kinds):

    replica           kill -9 of the rollout replica's process (the run replaces it)
    trainer           kill -9 of the trainer actor's process (the launch fails; `--resume auto` continues it)
    driver-term       SIGTERM to the driver (graceful stop with a checkpoint; `--resume auto` continues it)
    receiver-mid-sync the rollout replica killed (SIGKILL) in the middle of a weight sync: the soak creates the
                      file named by `debug.kill_replica_mid_sync_file`; the replica receiving the next sync's
                      second bucket (the first loaded, the rest in flight) deletes it and kills itself
                      (`engine.runtime.replica.killed_mid_transfer`). Injected = the file was claimed. How it
                      was got over (`recovery`, printed): "checked" = the replacement came up in that launch and
                      its weights passed the delivery check (a later `sync` event with `verified` 1.0);
                      "resumed" = the launch ended first and `--resume auto` went on. The next fault waits
                      (up to 180 s) for the replacement's checked weights
    disk-full         the checkpoint directory's own tmpfs filled for 60 s (root only; a periodic checkpoint then
                      fails with an error event and the run goes on)

and every minute a live operator action: `asyncrl ctl RUN pause`, then `resume` 5 s later (the knob that leaves
a deterministic run's result unchanged). At the end of each arm: the trained steps are exactly 1..N; every
prompt is in the ledger once, trained or dropped with a reason, and N × 8 trained; single: the final weights
hash equals the fault-free run's; multi: every hung call answered within its deadline + 2 s and no tool box
outlived the run; and no stall — a live launch that records no step for `STALL_S` (300 s) is recorded as a
STALL row (the check fails), stopped with SIGTERM and resumed, so the soak never hangs. The summary table (arm, fault, drawn / injected / survived) is printed and
written with every detail to `<out>/soak.json`. Exit 0 when every check of every arm holds.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from soak_lib import (REPO, ctl, fill, final_hash, kill_session, launch, ledger_exact,  # noqa: E402
                      mount_tmpfs, processes_mentioning, read_jsonl, recovery_after, role_pids, tool_counts,
                      trained_steps)

COMMON = ("trainer.ppo_mini_batch_size=8", "trainer.ppo_micro_batch_size_per_gpu=16", "rollout.n=4",
          "async_training.staleness_threshold=0.5",
          "async_training.trigger_parameter_sync_step=2", "trainer.test_freq=0", "trainer.val_before_train=false",
          "logging.progress=false", "checkpoint.every_versions=2", "checkpoint.keep_last=2")
HANG_TOOL = REPO / "scripts" / "soak_hang_tool.py"
HANG_TIMEOUT_S = 2
"""The hanging tool's deadline (wall clock; the box kills the call then)."""
PROMPTS_PER_STEP = 8
STALL_S = 300
"""A live launch that records no step for this long has stalled (a launch's start on a loaded machine takes up to
~3 minutes): the soak records it (a failed check), stops the launch with SIGTERM and resumes it."""
KINDS = ("replica", "trainer", "driver-term", "receiver-mid-sync", "disk-full")


PROBE_STEPS = 6
"""Steps of the fault-free probe that measures an arm's step time (the first, which waits for generation to fill
the pipeline, is left out of the mean)."""
MIN_STEPS = 12
"""The shortest faulted run (three periodic checkpoints: every 2 versions × a sync every 2 steps)."""
FAULT_GAP_S = 40.0
"""The mean time between two faults (drawn uniformly in 20-60 s)."""
RELAUNCHING = ("trainer", "driver-term")
"""The fault kinds that end a launch (the soak relaunches it with `--resume auto`: one more start-up)."""


@dataclass
class Arm:
    name: str
    preset: Path
    overrides: tuple[str, ...]
    deterministic: bool = False
    """Deterministic mode: a fault-free reference run first, and its final weights must be matched."""
    tool_file: Path | None = None
    faults: list[dict] = field(default_factory=list)


ARMS = {
    "single": Arm("single", REPO / "presets" / "runs" / "tiny-cpu.toml",
                  ("data.max_response_length=4", "trainer.deterministic=true"), deterministic=True),
    "multi": Arm("multi", REPO / "presets" / "runs" / "tiny-tools-cpu.toml",
                 ("rollout.multi_turn.tools=[]",
                  f'rollout.multi_turn.tool=[{{name="lookup", function="{HANG_TOOL}:lookup", '
                  f'timeout_s={HANG_TIMEOUT_S}, description="the secret of this prompt"}}]'), tool_file=HANG_TOOL),
}


def sets(arm: Arm, run_dir: Path, steps: int, name: str, ckpt_dir: Path | None, trigger: Path | None) -> list[str]:
    out = [*COMMON, *arm.overrides, f'logging.run_dir="{run_dir}"',
           f"rollout.total_rollout_steps={steps * PROMPTS_PER_STEP}", f'name="{name}"']
    if ckpt_dir is not None:
        out.append(f'checkpoint.dir="{ckpt_dir}"')
    if trigger is not None:
        out.append(f'debug.kill_replica_mid_sync_file="{trigger}"')
    return out


class Bag:
    """Fault kinds drawn without replacement, refilled (reshuffled) when empty: every kind comes once per round."""

    def __init__(self, kinds: list[str], rng: random.Random) -> None:
        self.kinds, self.rng, self.left = kinds, rng, []

    def draw(self) -> str:
        if not self.left:
            self.left = self.rng.sample(self.kinds, len(self.kinds))
        return self.left.pop()


def probe(arm: Arm, out: Path, log: Path) -> dict:
    """A fault-free run of `PROBE_STEPS` steps of the arm's config: `startup_s` (launch → first step recorded),
    `step_s` (mean of the trainer's `timing_s/step` after the first step: its wall time per local step, the
    wait for generation and the checkpoints included) and `total_s`; `error` when it failed."""
    run_dir = out / f"{arm.name}-probe"
    t0 = time.monotonic()
    proc, startup = launch(arm.preset, sets(arm, run_dir, PROBE_STEPS, f"soak-{arm.name}-probe", None, None), log), None
    while proc.poll() is None:
        if startup is None and trained_steps(run_dir):
            startup = time.monotonic() - t0
        time.sleep(0.2)
    kill_session(proc.pid)
    total = time.monotonic() - t0
    times = [r["timing_s/step"] for r in read_jsonl(run_dir / "metrics.jsonl") if "critic/rewards/mean" in r][1:]
    if proc.returncode != 0 or not times:
        return {"error": f"the fault-free probe failed (exit {proc.returncode})", "total_s": total}
    step_s = statistics.fmean(times)
    return {"startup_s": startup if startup is not None else total - len(times) * step_s, "step_s": step_s,
            "total_s": total, "checkpoint_mb": largest_checkpoint_mb(run_dir / "checkpoints")}


def largest_checkpoint_mb(ckpts: Path) -> float:
    """The largest checkpoint the probe wrote (MB; 0 when none): what one save needs on the disk."""
    sizes = [sum(f.stat().st_size for f in d.rglob("*") if f.is_file()) for d in ckpts.iterdir() if d.is_dir()] \
        if ckpts.is_dir() else []
    return max(sizes, default=0) / 2**20


def disk_mb(checkpoint_mb: float) -> int:
    """The checkpoint tmpfs: room for `keep_last` = 2 kept checkpoints, the one being written and a stop
    checkpoint, with a quarter to spare (at least 64 MB), so that after the 60 s fill ends the next save fits —
    a tmpfs sized below that kept refusing saves after the fill (the 2026-12-07 soak)."""
    return max(64, math.ceil(4 * checkpoint_mb * 1.25))


def plan(budget_s: float, startup_s: float, step_s: float, reference: bool, kinds: list[str]) -> int:
    """Steps N of an arm whose remaining share is `budget_s`: the reference run (when there is one) takes
    startup + N·step, the faulted run (startup + N·step) / (1 − f), where f is the share of its time lost to
    faults — each relaunching fault (`RELAUNCHING`, drawn with its share q of the kinds every `FAULT_GAP_S` on
    average) costs a start-up and ~2 steps redone from the last checkpoint, and the pause/resume knob 5 s a
    minute — capped at 0.7. Even (a sync every 2 steps), at least `MIN_STEPS`."""
    q = sum(k in RELAUNCHING for k in kinds) / max(1, len(kinds))
    f = min(0.7, q * (startup_s + 2 * step_s) / FAULT_GAP_S + 5 / 60)
    runs = (1 if reference else 0) + 1 / (1 - f)
    n = (budget_s / runs - startup_s) / max(step_s, 1e-3)
    return max(MIN_STEPS, int(n) // 2 * 2)


def soak(arm: Arm, run_dir: Path, steps: int, rng: random.Random, kinds: list[str], disk: Path | None,
         log: Path, deadline: float) -> int:
    """Run `arm` with faults until it ends (exit 0) or gives up; faults and knob actions only until `deadline`
    (time.monotonic(); the run is let to finish after it); the faults land in `arm.faults`; returns the number of
    launches."""
    name = f"soak-{arm.name}"
    trigger = run_dir.parent / f"{arm.name}-kill-receiver"
    trigger.unlink(missing_ok=True)
    overrides = sets(arm, run_dir, steps, name, disk / "ckpt" if disk else None, trigger)
    proc, launches = launch(arm.preset, overrides, log), 1
    faults = arm.faults
    ckpts = (disk / "ckpt") if disk else run_dir / "checkpoints"
    while proc.poll() is None and not any(p.name.startswith("global_step_") for p in ckpts.glob("*")):
        time.sleep(0.2)  # faults start once a checkpoint exists: before it a trainer kill has nothing to resume
    next_fault = time.monotonic() + rng.uniform(5, 30)
    next_knob, full_until, pending, claimed = time.monotonic() + 60, None, None, None
    metrics = run_dir / "metrics.jsonl"
    seen = (-1, time.monotonic())  # (metrics.jsonl's size, when it last changed): a stall shows as no change
    bag = Bag([k for k in kinds if k != "disk-full" or disk is not None], rng)
    while True:
        now = time.monotonic()
        if pending is not None and not trigger.exists():  # a replica claimed the file: it died mid-transfer
            pending["injected"], pending, claimed = True, None, (pending["time"], now)
        if claimed is not None and (recovery_after(run_dir, claimed[0]) != "none" or now - claimed[1] > 180):
            claimed = None  # the next fault waits (up to 180 s) for the replacement's checked weights
        if proc.poll() is not None:
            kill_session(proc.pid)
            if proc.returncode == 0 and final_hash(run_dir) is not None:
                break
            if launches > 40:
                raise RuntimeError(f"gave up after {launches} launches (last exit {proc.returncode}); see {log}")
            proc, launches = launch(arm.preset, overrides, log, resume=True), launches + 1
            seen = (-1, time.monotonic())
            continue
        size = metrics.stat().st_size if metrics.exists() else 0
        if size != seen[0]:
            seen = (size, now)
        elif now - seen[1] > STALL_S:  # alive, and no step recorded for STALL_S: stop it gracefully, resume
            faults.append({"kind": f"STALL: no step for {STALL_S} s (ended by SIGTERM)",
                           "step": len(trained_steps(run_dir)), "time": time.time(), "injected": False})
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=180)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
            continue
        if full_until is not None and now >= full_until:
            (disk / "ballast").unlink(missing_ok=True)
            full_until = None
        if now >= deadline:  # the share is spent: no more faults or knob actions, the run finishes
            next_knob = next_fault = float("inf")
        if now >= next_knob:
            ok = ctl(name, "pause")
            time.sleep(5)
            ok = ctl(name, "resume") and ok
            faults.append({"kind": "knob pause/resume", "step": len(trained_steps(run_dir)), "injected": ok})
            next_knob = time.monotonic() + 60
        if now >= next_fault and bag.kinds and claimed is None:
            kind = bag.draw()
            fault = {"kind": kind, "step": len(trained_steps(run_dir)), "time": time.time(), "injected": True}
            if kind in ("replica", "trainer"):
                pids = role_pids(proc.pid, kind)
                fault["injected"] = bool(pids)
                for pid in pids:
                    os.kill(pid, signal.SIGKILL)
            elif kind == "driver-term":
                os.kill(proc.pid, signal.SIGTERM)
            elif kind == "disk-full":
                fault["injected"] = full_until is None
                if full_until is None:
                    fill(disk)
                    full_until = time.monotonic() + 60
            elif kind == "receiver-mid-sync":
                fault["injected"] = None if pending is None else False  # decided when a replica claims it
                if pending is None:
                    trigger.touch()
                    pending = fault
            faults.append(fault)
            next_fault = time.monotonic() + rng.uniform(20, 60)
            if kind in ("trainer", "driver-term"):  # the launch ends: wait for it (then `--resume auto`)
                try:
                    proc.wait(timeout=180)
                except subprocess.TimeoutExpired:
                    os.kill(proc.pid, signal.SIGKILL)
        time.sleep(0.5)
    if pending is not None:  # no sync after it: never injected
        pending["injected"] = False
        trigger.unlink(missing_ok=True)
    if disk is not None:
        (disk / "ballast").unlink(missing_ok=True)
    return launches


def run_arm(arm: Arm, share_s: float, out: Path, rng: random.Random, kinds: list[str], log: Path) -> dict:
    """The probe (sizing the arm to its `share_s` of wall clock), the fault-free reference (deterministic arms),
    then the faulted run (faults until the share's end), then the checks; the arm's summary."""
    start = time.monotonic()
    deadline = start + share_s
    measured = probe(arm, out, log)
    if "error" in measured:
        return {"arm": arm.name, "steps": 0, "error": measured["error"], "checks": {"probe run": False},
                "faults": [], "planned_s": round(share_s), "taken_s": round(time.monotonic() - start)}
    steps = plan(deadline - time.monotonic(), measured["startup_s"], measured["step_s"], arm.deterministic, kinds)
    t0 = time.monotonic()
    ref = out / f"{arm.name}-reference" if arm.deterministic else None
    if ref is not None:
        rc = launch(arm.preset, sets(arm, ref, steps, f"soak-{arm.name}-reference", None, None), log).wait()
        if rc != 0:
            return {"arm": arm.name, "steps": steps, "error": f"the fault-free reference run failed (exit {rc})",
                    "checks": {"reference run": False}, "faults": [], "planned_s": round(share_s),
                    "taken_s": round(time.monotonic() - start)}
    ref_s = time.monotonic() - t0
    disk = out / f"{arm.name}-disk"
    mounted = "disk-full" in kinds and os.geteuid() == 0 and mount_tmpfs(disk, disk_mb(measured.get("checkpoint_mb", 0.0)))
    t1 = time.monotonic()
    run_dir = out / arm.name
    try:
        launches = soak(arm, run_dir, steps, rng, kinds, disk if mounted else None, log, deadline)
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(disk)], check=False)
    soak_s = time.monotonic() - t1
    for f in arm.faults:
        if f["kind"] == "receiver-mid-sync":
            f["recovery"] = recovery_after(run_dir, f["time"]) if f["injected"] else "none"
    checks = {
        "no stall": not any(f["kind"].startswith("STALL") for f in arm.faults),
        "steps contiguous": trained_steps(run_dir) == list(range(1, steps + 1)),
        "ledger exact": ledger_exact(run_dir, steps * PROMPTS_PER_STEP) is None,
    }
    if ref is not None:
        checks["final weights = fault-free run"] = final_hash(run_dir) == final_hash(ref) is not None
    tools = tool_counts(run_dir) if arm.tool_file else None
    if tools is not None:
        checks["no tool box outlived the run"] = processes_mentioning(str(arm.tool_file)) == []
        checks["hung tools answered within their deadline + 2 s"] = tools["latency_max_s"] < HANG_TIMEOUT_S + 2
    errors = [e for e in read_jsonl(run_dir / "events.jsonl") if e["kind"] == "checkpoint" and e["level"] == "error"]
    return {"arm": arm.name, "steps": steps, "planned_s": round(share_s), "taken_s": round(time.monotonic() - start),
            "probe": {k: round(v, 2) for k, v in measured.items()}, "faulted_until_s": max(0, round(deadline - t1)),
            "reference_s": round(ref_s) if ref else None, "soak_s": round(soak_s),
            "launches": launches, "disk_fault": mounted, "faults": arm.faults, "checks": checks,
            "checkpoint_errors": len(errors), "ledger_problem": ledger_exact(run_dir, steps * PROMPTS_PER_STEP),
            "tools": tools, "final_hash": final_hash(run_dir)}


def table(results: list[dict]) -> list[str]:
    lines = ["| arm | fault | drawn | injected | survived (run ended with every check holding) |", "|---|---|---|---|---|"]
    for res in results:
        ok = all(res["checks"].values())
        faults = res["faults"]
        for kind in sorted({f["kind"] for f in faults}):
            got = [f for f in faults if f["kind"] == kind]
            hit = sum(bool(f["injected"]) for f in got)
            survived = sum(bool(f["injected"]) and f.get("recovery") != "none" for f in got) if ok else 0
            lines.append(f"| {res['arm']} | {kind} | {len(got)} | {hit} | {survived} |")
        if res.get("tools"):
            t = res["tools"]
            hung = int(t["timeouts"])
            lines.append(f"| {res['arm']} | tool hung, killed at its {HANG_TIMEOUT_S} s deadline (answer `timeout`) "
                         f"| {hung} | {hung} | {hung if ok else 0} |")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=30.0,
                    help="the soak's wall-clock plan, split between the arms (probe, reference, faulted run)")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--arms", default="single,multi", help=f"comma-separated, of {', '.join(ARMS)}")
    ap.add_argument("--faults", default=",".join(KINDS), help=f"comma-separated, of {', '.join(KINDS)}")
    a = ap.parse_args()
    arms = [ARMS[x] for x in a.arms.split(",") if x]
    kinds = [k for k in a.faults.split(",") if k]
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not arms:
        print(f"soak: unknown fault kind(s) {unknown}" if unknown else "soak: no arm")
        return 2
    seed = a.seed if a.seed is not None else time.time_ns() % 100_000
    out = a.out or Path(tempfile.mkdtemp(prefix="asyncrl-soak-"))
    out.mkdir(parents=True, exist_ok=True)
    log = out / "launches.log"
    rng = random.Random(seed)
    results = []
    t0 = time.monotonic()
    for arm in arms:  # an even share each (an arm's overrun — the rest of its last run — does not cut the next)
        results.append(run_arm(arm, a.minutes * 60 / len(arms), out, rng, kinds, log))
    taken = (time.monotonic() - t0) / 60
    (out / "soak.json").write_text(json.dumps({"seed": seed, "minutes": a.minutes, "minutes_taken": round(taken, 1),
                                               "arms": results}, indent=2))
    print(f"soak: seed {seed}; {out}")
    print(f"soak: {a.minutes:g} min planned, {taken:.1f} min taken")
    for res in results:
        print(f"soak: arm {res['arm']}: {res['planned_s'] / 60:.1f} min planned, {res['taken_s'] / 60:.1f} min taken"
              + (f" (probe: {res['probe']['step_s']:.2f} s/step, start-up {res['probe']['startup_s']:.0f} s; "
                 f"faults for the first {res['faulted_until_s'] / 60:.1f} min of the faulted run)"
                 if "probe" in res else ""))
        if "error" in res:
            print(f"soak: arm {res['arm']}: {res['error']}; see {log}")
            continue
        tools = ""
        if res.get("tools"):
            t = res["tools"]
            tools = (f"; tool calls {int(t['calls'])} ({int(t['errors'])} errors, {int(t['timeouts'])} of them "
                     f"timeouts), slowest answer {t['latency_max_s']:.1f} s")
        ref = f", reference {res['reference_s'] / 60:.1f} min" if res["reference_s"] else ""
        print(f"soak: arm {res['arm']}: {res['steps']} steps, faulted run {res['soak_s'] / 60:.1f} min "
              f"({res['launches']} launches, {sum(bool(f['injected']) for f in res['faults'])} faults or knob "
              f"actions injected){ref}{tools}")
        mid = [f.get("recovery") for f in res["faults"] if f["kind"] == "receiver-mid-sync" and f["injected"]]
        if mid:
            print(f"soak: arm {res['arm']}: replica killed mid-sync {len(mid)}×: replacement's weights checked "
                  f"in the same launch {mid.count('checked')}×, launch ended first and resumed "
                  f"{mid.count('resumed')}×, neither {mid.count('none')}×")
    print("\n".join(table(results)))
    for res in results:
        for name, ok in res["checks"].items():
            print(f"check: {res['arm']}: {name}: {'ok' if ok else 'FAILED'}")
    return 0 if all(all(r["checks"].values()) for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
