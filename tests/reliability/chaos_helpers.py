"""Helpers for the deterministic-mode and chaos tests: the deterministic tiny config, what two runs must share
(final weights hash, ledger, metrics), and the processes of a launch that a chaos kill can pick from."""

from __future__ import annotations

from pathlib import Path

from reliability_helpers import events, read_jsonl, session_pids

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
