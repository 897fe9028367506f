"""The fully async engine on a real local Ray: versions, sync cadence, ledger, staleness, sync baseline."""

from __future__ import annotations

import collections

import pytest

from engine.runtime.driver import run
from engine.plan.run_plan import resolve_plan
from run_helpers import read_jsonl, tiny_config, train_records

pytestmark = pytest.mark.integration

SMALL = ("trainer.ppo_mini_batch_size=8", "trainer.ppo_micro_batch_size_per_gpu=16", "rollout.n=4",
         "rollout.total_rollout_steps=96", "trainer.test_freq=0")


def _ledger(run_dir):
    return read_jsonl(run_dir / "ledger.jsonl")


def test_fully_async_versions_cadence_and_ledger(run_dir):
    cfg = tiny_config(run_dir, *SMALL, "async_training.trigger_parameter_sync_step=2",
                      "async_training.staleness_threshold=0.5")
    assert run(resolve_plan(cfg), progress=False) == 0

    recs = train_records(run_dir)
    assert [r["training/global_step"] for r in recs] == list(range(1, 13))
    # the version counts syncs, one every 2 local steps
    assert [r["fully_async/count/current_param_version"] for r in recs] == [k // 2 for k in range(1, 13)]
    syncs = [e for e in read_jsonl(run_dir / "events.jsonl") if e["kind"] == "sync"]
    assert [e["step"] for e in syncs] == [2, 4, 6, 8, 10, 12]
    assert all("timing_s/param_sync" in r for r in recs if r["training/global_step"] % 2 == 0)
    # every admitted prompt is accounted for exactly once
    ledger = _ledger(run_dir)
    uids = [e["uid"] for e in ledger]
    assert len(uids) == len(set(uids))
    status = collections.Counter(e["status"] for e in ledger)
    assert status["trained"] == 12 * 8
    assert set(status) <= {"trained", "dropped", "in_flight_at_end"}
    # required per-step metrics, with verl's names
    for key in ("critic/rewards/mean", "response_length/mean", "fully_async/count/stale_trajectory_processed",
                "fully_async/count/dropped_stale_samples", "fully_async/monitor/queue/mq_queue_size",
                "fully_async/trainer/idle_ratio", "asyncrl/trainer/tokens_per_s", "asyncrl/rollout/tokens_per_s",
                "actor/entropy", "rollout_corr/kl", "asyncrl/staleness_hist"):
        assert key in recs[-1], key
    # staleness never exceeds verl's nominal bound ceil(staleness_threshold) + the partial-rollout span
    assert max(r["asyncrl/staleness/max"] for r in recs) <= 2
    # the run's own report: where a user looks after the run
    report = (run_dir / "report.md").read_text()
    assert "outcome: **finished**" in report and "trained 12 steps" in report
    assert "| weight syncs | 6 (6 verified)" in report and "96 trained" in report


def test_hard_staleness_cap_drops_and_logs(run_dir):
    cfg = tiny_config(run_dir, *SMALL, "async_training.trigger_parameter_sync_step=1",
                      "async_training.staleness_threshold=2.0", "async_training.max_staleness_versions=0",
                      'async_training.stale_policy="drop"')
    assert run(resolve_plan(cfg), progress=False) == 0
    recs = train_records(run_dir)
    assert all(r["asyncrl/staleness/max"] == 0 for r in recs)  # nothing older than the cap was trained
    ledger = _ledger(run_dir)
    dropped = [e for e in ledger if e["status"] == "dropped"]
    assert dropped and all(e["reason"] == "stale" for e in dropped)
    drops = [e for e in read_jsonl(run_dir / "events.jsonl") if e["kind"] == "drop"]
    assert sum(len(e["uids"]) for e in drops) == len(dropped)
    # a drop during step k is an event of step k − 1; drops after the last step (the stream ran out while the
    # trainer dropped a batch) come after the last record
    last = recs[-1]["training/global_step"]
    assert recs[-1]["fully_async/count/dropped_stale_samples"] == sum(len(e["uids"]) for e in drops
                                                                     if e["step"] < last)
    uids = [e["uid"] for e in ledger]
    assert len(uids) == len(set(uids))


def test_sync_mode_is_on_policy(run_dir):
    cfg = tiny_config(run_dir, *SMALL, 'async_training.mode="sync"', "async_training.trigger_parameter_sync_step=2")
    assert run(resolve_plan(cfg), progress=False) == 0
    recs = train_records(run_dir)
    assert len(recs) == 12
    assert all(r["asyncrl/staleness/max"] == 0 for r in recs)
    assert all(r["fully_async/partial/total_partial_num"] == 0 for r in recs)
    # on-policy: the rollout log-probs are the trainer's at the first local step of each version (fp32)
    firsts = [r for r in recs if r["training/global_step"] % 2 == 1]
    assert all(abs(r["rollout_corr/kl"]) < 1e-4 for r in firsts)


def test_partial_rollout_resumes_across_syncs(run_dir):
    # long responses and a rollout wave that outlasts a train step: syncs land while sequences are in flight
    cfg = tiny_config(run_dir, "trainer.ppo_mini_batch_size=4", "trainer.ppo_micro_batch_size_per_gpu=32",
                      "rollout.n=8", "rollout.total_rollout_steps=48", "data.max_response_length=48",
                      "trainer.test_freq=0", "async_training.trigger_parameter_sync_step=1",
                      "async_training.staleness_threshold=1.0", "async_training.partial_rollout=true")
    assert run(resolve_plan(cfg), progress=False) == 0
    recs = train_records(run_dir)
    assert sum(r["fully_async/partial/total_partial_num"] for r in recs) > 0
    assert max(r["fully_async/partial/max_partial_span"] for r in recs) >= 1
    assert all(r["response_length/max"] <= 48 for r in recs)  # the cumulative budget holds across resumes


@pytest.mark.slow  # tests/reliability/test_trainer_failure.py kills the trainer too, and resumes
def test_trainer_crash_fails_the_run_loudly(run_dir, capsys):
    cfg = tiny_config(run_dir, *SMALL, "debug.kill_trainer_at_step=3")
    assert run(resolve_plan(cfg), progress=False) == 1
    err = capsys.readouterr().err
    assert "trainer failed" in err
    events = read_jsonl(run_dir / "events.jsonl")
    assert any(e["kind"] == "error" and "trainer" in e["message"] for e in events)
