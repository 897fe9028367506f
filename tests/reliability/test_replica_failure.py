"""(b) A rollout replica's process dies mid-run: its requests are re-queued, a replacement gets the current
weights, the run finishes with an exact ledger; past `rollout.max_replica_restarts` the run stops cleanly
with a resumable checkpoint and exit code 1."""

from __future__ import annotations

import pytest
from reliability_helpers import assert_ledger_exact, events, tiny_config, train_steps

from engine.persist.checkpoint import latest_valid, read_checkpoint
from engine.runtime.driver import run
from engine.persist.resume import find_resume_point
from engine.plan.run_plan import resolve_plan

pytestmark = pytest.mark.integration

EXTRA = ("rollout.total_rollout_steps=160", "data.max_response_length=8", "debug.kill_replica_at_step=3")


def test_dead_replica_is_replaced_and_the_run_finishes(tmp_path) -> None:
    run_dir = tmp_path / "run"
    cfg = tiny_config(run_dir, *EXTRA)
    assert run(resolve_plan(cfg), progress=False) == 0

    assert events(run_dir, "fault")
    phases = [e["phase"] for e in events(run_dir, "replica")]
    assert phases == ["restart", "replaced"], phases
    restart = events(run_dir, "replica")[0]
    assert restart["replica"] == 0 and "died" in restart["message"]
    assert [s for s, _ in train_steps(run_dir)] == list(range(1, 21))
    assert_ledger_exact(cfg, run_dir, trained=160)


def test_spent_restart_budget_stops_with_a_resumable_checkpoint(tmp_path, capsys) -> None:
    run_dir = tmp_path / "run"
    cfg = tiny_config(run_dir, *EXTRA, "rollout.max_replica_restarts=0")
    assert run(resolve_plan(cfg), progress=False) == 1

    err = capsys.readouterr().err
    line = [ln for ln in err.splitlines() if "run failed" in ln]
    assert len(line) == 1 and "rollout.max_replica_restarts = 0" in line[0]
    assert f"--resume {run_dir}" in line[0], line[0]  # a command that works when pasted
    assert [e["phase"] for e in events(run_dir, "replica")] == ["exhausted"]
    ckpt = latest_valid(run_dir / "checkpoints")
    assert ckpt is not None and read_checkpoint(ckpt)["state"]["reason"] == "stop"
    point = find_resume_point(cfg, "auto")
    assert point is not None and point.ckpt["path"] == str(ckpt)


def test_a_bucket_corrupted_on_the_wire_fails_the_run_naming_replica_and_bucket(tmp_path, capsys) -> None:
    """The delivery check of every sync: one byte of bucket 0 flipped after the trainer's checksum (as a fault
    on the wire would) → the replicas' checksums differ → the run fails at the first sync, saying which replica
    and which bucket, instead of training on against weights the rollout never had."""
    run_dir = tmp_path / "run"
    cfg = tiny_config(run_dir, "rollout.total_rollout_steps=32", "data.max_response_length=8",
                      "debug.corrupt_sync_bucket=0")
    assert run(resolve_plan(cfg), progress=True) == 1
    err = capsys.readouterr().err
    failed = [ln for ln in err.splitlines() if "run failed" in ln]
    assert len(failed) == 1 and "rollout replica 0 loaded bucket 0 (" in failed[0], failed
    assert "corrupted" in failed[0]
    assert not events(run_dir, "sync")  # no sync was reported as done
    # the terminal shows the trainer's error as one line, never the actor's traceback; events.jsonl keeps it
    assert "Traceback" not in err and 'File "' not in err, err
    error = [e for e in events(run_dir, "error") if e["message"].startswith("trainer failed at step")]
    assert len(error) == 1 and "\n" not in error[0]["message"], error
    assert "SyncDeliveryError: weight sync v1: rollout replica 0 loaded bucket 0" in error[0]["message"]
    assert "Traceback" in error[0]["traceback"]


DETERMINISTIC = ("trainer.deterministic=true", "async_training.staleness_threshold=0.5",
                 "async_training.trigger_parameter_sync_step=2", "data.max_response_length=4",
                 "rollout.total_rollout_steps=160")


@pytest.mark.slow
def test_a_replica_killed_mid_transfer_is_caught_up_before_the_next_step(tmp_path) -> None:
    """A receiver killed in the middle of the first weight sync (`debug.kill_replica_mid_sync_file`: the replica
    that receives the sync's second bucket while the file exists deletes it and SIGKILLs itself), in
    deterministic mode with a sync every 2 steps — the queue already holds step 3's batch, and step 4's needs
    the missing replica. That sync's check has no receipt from it; the trainer waits for the replacement and
    catches it up with the sync's weights before step 3 (without that wait the replacement waited for a sync
    that needed its own rollouts: a deadlock); the run finishes with an exact ledger and the fault-free run's
    final weights."""
    run_dir, trigger = tmp_path / "run", tmp_path / "kill-receiver"
    trigger.touch()
    cfg = tiny_config(run_dir, *DETERMINISTIC, f'debug.kill_replica_mid_sync_file="{trigger}"')
    assert run(resolve_plan(cfg), progress=False) == 0

    assert not trigger.exists()  # claimed by the replica that died
    assert [e["phase"] for e in events(run_dir, "replica")] == ["restart", "replaced"]
    died_in, catch_up, *later = events(run_dir, "sync")
    assert died_in["buckets"] >= 2 and (died_in["replicas_verified"], died_in["verified"]) == (0, 0.0), died_in
    assert catch_up["catch_up"] == [0] and catch_up["step"] == died_in["step"] == 2, catch_up
    assert (catch_up["verified"], catch_up["replicas_verified"]) == (1.0, 1)
    assert later and all(s["verified"] == 1.0 and s["replicas_verified"] == 1 for s in later), later
    assert [s for s, _ in train_steps(run_dir)] == list(range(1, 21))
    assert_ledger_exact(cfg, run_dir, trained=160)

    ref_dir = tmp_path / "reference"
    assert run(resolve_plan(tiny_config(ref_dir, *DETERMINISTIC)), progress=False) == 0
    assert events(run_dir, "weights")[-1]["weights_sha256"] == events(ref_dir, "weights")[-1]["weights_sha256"]
