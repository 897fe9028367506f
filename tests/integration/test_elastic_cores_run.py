"""Elastic cores on a real local Ray run of the tiny preset: the trainer's and the replica's intra-op threads
change at their boundaries on the core's commands, and the run's metrics show what each step and decode step
ran with; off, nothing moves."""

from __future__ import annotations

import pytest

from engine.plan.run_plan import resolve_plan
from engine.runtime.driver import run
from run_helpers import tiny_config, train_records

pytestmark = pytest.mark.integration

SMALL = ("trainer.ppo_mini_batch_size=8", "trainer.ppo_micro_batch_size_per_gpu=16", "rollout.n=4",
         "rollout.total_rollout_steps=64", "trainer.test_freq=0")


def test_lending_moves_the_threads_and_the_metrics_show_it(run_dir) -> None:
    plan = resolve_plan(tiny_config(run_dir, *SMALL, "resources.elastic_cores=true"))
    split = plan.role_specs().rollout.elastic
    assert split.enabled
    assert run(plan, progress=False) == 0
    recs = train_records(run_dir)
    assert len(recs) == 8
    lent = split.trainer_threads  # a waiting trainer lends its threads to the one replica
    for r in recs:
        # every step ran with the split or the split plus what the replica lent
        assert r["asyncrl/threads/trainer"] in (split.trainer_threads, split.trainer_threads + split.replica_threads)
        assert split.replica_threads <= r["asyncrl/threads/rollout"] <= split.replica_threads + lent
    # the trainer waits for every batch here: the replica's decode steps ran with the borrowed threads
    assert max(r["asyncrl/threads/rollout"] for r in recs) > split.replica_threads
    assert recs[-1]["asyncrl/elastic/lends/trainer"] >= len(recs) - 1


def test_off_the_threads_stay_the_plans_split(run_dir) -> None:
    plan = resolve_plan(tiny_config(run_dir, *SMALL))
    assert not plan.role_specs().rollout.elastic.enabled  # the default
    assert run(plan, progress=False) == 0
    recs = train_records(run_dir)
    assert {r["asyncrl/threads/trainer"] for r in recs} == {plan.actors["trainer_threads"]}
    assert not any("asyncrl/threads/rollout" in r or "asyncrl/elastic/lends/trainer" in r for r in recs)
