"""Helpers for the deterministic-mode and chaos tests: the deterministic tiny config, what two runs must share
(final weights hash, ledger, metrics), and the processes of a launch that a chaos kill can pick from."""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

from reliability_helpers import events, kill_session, launch, read_jsonl, session_pids, wait_for

DETERMINISTIC = ("trainer.deterministic=true", "async_training.staleness_threshold=0",
                 "async_training.trigger_parameter_sync_step=1", "data.max_response_length=4")

TIMING_FREE = ("actor/", "critic/", "response_length/", "rollout_corr/", "asyncrl/staleness/", "asyncrl/is_ratio/",
               "asyncrl/mismatch/", "asyncrl/zero_adv_fraction", "training/", "fully_async/count/current_param_version",
               "fully_async/count/stale_trajectory_processed", "fully_async/partial/")
"""Prefixes of the per-step metrics that do not measure time, sizes seen at a moment, or throughput."""


def final_hash(run_dir: Path) -> str:
    """The last `weights_sha256` the run reported at its end (events.jsonl, kind `weights`)."""
    found = events(run_dir, "weights")
    assert found, f"no final weights hash in {run_dir}/events.jsonl"
    return found[-1]["weights_sha256"]


def ledger_by_step(run_dir: Path) -> list[tuple[str, str, int, int]]:
    """(uid, status, step, version) of every ledger entry, sorted (times left out)."""
    return sorted((e["uid"], e["status"], e["step"], e["version"]) for e in read_jsonl(run_dir / "ledger.jsonl"))


def step_metrics(run_dir: Path, from_step: int = 0) -> dict[int, dict]:
    """The timing-free part of every training record with `training/global_step > from_step`."""
    out = {}
    for r in read_jsonl(run_dir / "metrics.jsonl"):
        step = r.get("training/global_step")
        if "critic/rewards/mean" in r and step > from_step:
            out[step] = {k: v for k, v in r.items() if k.startswith(TIMING_FREE)}
    return out


def role_pids(sid: int) -> dict[str, list[int]]:
    """Processes of launch session `sid` by role: `driver` (the launch itself), `trainer` (the Ray worker of
    the `Trainer` actor), `replica` (those of `RolloutReplica` actors), found by Ray's process titles."""
    roles: dict[str, list[int]] = {"driver": [sid], "trainer": [], "replica": []}
    for pid in session_pids(sid):
        try:
            title = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
        except OSError:
            continue
        if title.startswith("ray::Trainer") and not title.startswith("ray::TrainerRank"):
            roles["trainer"].append(pid)
        elif title.startswith("ray::RolloutReplica"):
            roles["replica"].append(pid)
    return roles


def newest_checkpoint(run_dir: Path) -> int:
    """The step of the newest published checkpoint (-1 when there is none)."""
    from engine.persist.checkpoint import list_checkpoints, step_of

    return max((step_of(p) for p in list_checkpoints(run_dir / "checkpoints")), default=-1)


def chaos_run(run_dir: Path, extra: tuple[str, ...], kills: int, rng: random.Random,
              roles: tuple[str, ...] = ("driver", "trainer", "replica"), max_delay_s: float = 1.5) -> list[str]:
    """Launch the tiny preset with `extra`; `kills` times: wait for a checkpoint newer than any seen, wait a
    random delay, SIGKILL a random role's process (`role_pids`); after a driver or trainer kill the launch is
    gone (a dead trainer fails it) and `--resume auto` relaunches it; a killed replica is replaced by the
    run itself. Then wait for the last launch to exit 0. Returns what was killed, in order ("role@step")."""
    done: list[str] = []
    proc = launch(run_dir, *extra)
    try:
        for _ in range(kills):
            seen = newest_checkpoint(run_dir)
            wait_for(lambda: newest_checkpoint(run_dir) > seen, timeout=300, proc=proc)
            time.sleep(rng.uniform(0.0, max_delay_s))
            role = rng.choice(roles)
            pids = role_pids(proc.pid)[role]
            assert proc.poll() is None, f"the run ended before kill {len(done) + 1} ({done})"
            assert pids, f"no {role} process in the launch's session"
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
            done.append(f"{role}@{newest_checkpoint(run_dir)}")
            if role == "replica":
                continue
            proc.wait(timeout=120)  # a driver dies at once; a dead trainer fails the run
            kill_session(proc.pid)
            proc.stdout.close()
            proc = launch(run_dir, *extra, resume="auto")
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"the last launch exited {proc.returncode} after {done}: {out[-3000:]}"
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        kill_session(proc.pid)
    return done


def checkpoint_hashes(run_dir: Path) -> dict[int, str]:
    """`weights_sha256` of every checkpoint still on disk, by step."""
    import json

    from engine.persist.checkpoint import list_checkpoints, step_of

    return {step_of(p): json.loads((p / "state.json").read_text())["weights_sha256"]
            for p in list_checkpoints(run_dir / "checkpoints")}


def assert_same_checkpoint_hashes(run_dir: Path, reference: Path, why: str) -> None:
    """Checkpoints of one step in both runs hold the same weights (at least one step in common)."""
    mine, ref = checkpoint_hashes(run_dir), checkpoint_hashes(reference)
    common = sorted(set(mine) & set(ref))
    assert common, f"no checkpoint step in common ({sorted(mine)} vs {sorted(ref)})"
    assert {s: mine[s] for s in common} == {s: ref[s] for s in common}, why
