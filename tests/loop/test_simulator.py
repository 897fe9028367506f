"""The loop's decision cores under the deterministic simulator: thousands of random scenarios keep every
property (`asyncrl simulate --check`), and each hang the simulator found is a shrunk regression scenario here.
Each regression test also shows the simulator catching the bug when the fix is taken out."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from asyncrl_cli.app import app
from engine.loop.commands import PollControl, Sync
from engine.loop.dispatch import DispatchTable
from engine.control.knob_table import KNOBS
from engine.loop.knobs import KnobChange
from engine.loop.rollout import RolloutLoop, RolloutParams
from engine.loop.rollout_knobs import RolloutKnobs
from engine.loop.sim.checks import Checker
from engine.loop.sim.runner import run_scenario
from engine.loop.sim.scenario import Action, Scenario, draw
from engine.loop.stream import PromptStream
from engine.loop.trainer import TrainerLoop, TrainerParams


def test_simulate_check_cli_runs_thousands_of_scenarios_clean() -> None:
    result = CliRunner().invoke(app, ["simulate", "--check", "--scenarios", "2000", "--seed", "1"])
    assert result.exit_code == 0, result.output
    assert "2000 scenarios, 0 violations" in result.output


def test_replay_reproduces_a_scenario_exactly() -> None:
    a, b = run_scenario(draw(414056766)), run_scenario(draw(414056766))
    assert (a.sim_time, a.steps, a.versions, a.staleness) == (b.sim_time, b.steps, b.versions, b.staleness)
    result = CliRunner().invoke(app, ["simulate", "--replay", "414056766"])
    assert result.exit_code == 0 and "scenario 414056766" in result.output


def _raise_trigger() -> Scenario:
    """The issue's hang: the tiny preset at trigger 1, the operator raises it to 4 mid-run."""
    return Scenario(seed=1, n=2, ppo_mini_batch_size=4, trigger=1, staleness_threshold=0.5, total_prompts=96,
                    actions=[Action(1.0, "trigger_parameter_sync_step", 4)])


def test_raising_the_sync_interval_live_finishes(monkeypatch) -> None:
    out = run_scenario(_raise_trigger())
    assert out.finished and not out.violations
    assert out.steps == 24
    # the bug it was: the budget took the new interval only at the next sync, which then never came
    monkeypatch.setattr(RolloutLoop, "set_trigger", lambda self, trigger: [])
    broken = run_scenario(_raise_trigger())
    assert any("deadlock" in v for v in broken.violations), broken.violations


def _lower_trigger() -> Scenario:
    """Trigger 4 lowered to 1 after a few steps of a version: the sync is owed at once."""
    return Scenario(seed=2, n=2, ppo_mini_batch_size=3, require_batches=1, trigger=4, staleness_threshold=0.0,
                    total_prompts=60, token_cost=0.01, actions=[Action(0.5, "trigger_parameter_sync_step", 1)])


def test_lowering_the_sync_interval_below_the_steps_done_syncs_at_once(monkeypatch) -> None:
    out = run_scenario(_lower_trigger())
    assert out.finished and not out.violations
    monkeypatch.setattr(TrainerLoop, "sync_owed", lambda self: False)
    assert any("deadlock" in v for v in run_scenario(_lower_trigger()).violations)


def _wait_cap_zero() -> Scenario:
    return Scenario(seed=3, n=2, ppo_mini_batch_size=4, trigger=1, staleness_threshold=0.5,
                    max_staleness_versions=0, stale_policy="wait", total_prompts=40)


def test_wait_policy_with_a_zero_cap_finishes_on_policy(monkeypatch) -> None:
    out = run_scenario(_wait_cap_zero())
    assert out.finished and not out.violations
    assert set(out.staleness) == {0}
    monkeypatch.setattr(RolloutLoop, "allow", lambda self, k: [])  # the old rule: postpone and wait
    assert any("deadlock" in v for v in run_scenario(_wait_cap_zero()).violations)


def _raise_then_die() -> Scenario:
    return Scenario(seed=4, n=2, ppo_mini_batch_size=2, trigger=1, total_prompts=60, checkpoint_every_versions=1,
                    actions=[Action(0.2, "trigger_parameter_sync_step", 3)], trainer_deaths=[2.0])


def test_a_raised_interval_survives_a_trainer_death_and_resume(monkeypatch) -> None:
    out = run_scenario(_raise_then_die())
    assert out.finished and not out.violations
    restore = TrainerLoop.restore

    def forget_the_interval(self, st):  # the bug it guards: the checkpoint's live interval not restored
        restore(self, {k: v for k, v in st.items() if k != "trigger"})

    monkeypatch.setattr(TrainerLoop, "restore", forget_the_interval)
    assert any("resume reverted trigger" in v for v in run_scenario(_raise_then_die()).violations)


def _sync_mode_change() -> Scenario:
    return Scenario(seed=5, n=1, ppo_mini_batch_size=2, trigger=3, mode="sync", total_prompts=60,
                    actions=[Action(1.0, "trigger_parameter_sync_step", 1),
                             Action(3.0, "trigger_parameter_sync_step", 4)])


def test_sync_mode_interval_change_keeps_it_on_policy(monkeypatch) -> None:
    out = run_scenario(_sync_mode_change())
    assert out.finished and not out.violations and set(out.staleness) == {0}
    # the bug it guards: sync mode taking the interval at a local-step boundary, in the middle of a cycle
    monkeypatch.setattr("engine.loop.trainer.boundary", lambda name, sync_mode: "step")
    broken = run_scenario(_sync_mode_change())
    assert broken.violations, "the checker must see an interval taken mid-cycle in sync mode"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 4), mini=st.integers(1, 4), rb=st.integers(1, 3), trigger=st.integers(1, 6),
       staleness=st.sampled_from([0.0, 0.1, 0.5, 1.0, 3.0]), partial=st.booleans(),
       cap=st.sampled_from([None, 0, 1, 2]), policy=st.sampled_from(["drop", "wait"]),
       replicas=st.integers(1, 3), seqs=st.sampled_from([1, 4, 16]), sync=st.booleans(),
       new_trigger=st.integers(1, 8), at=st.floats(0.0, 5.0), val=st.sampled_from([0, 2]))
def test_any_schema_valid_config_with_a_live_change_finishes(n, mini, rb, trigger, staleness, partial, cap, policy,
                                                             replicas, seqs, sync, new_trigger, at, val) -> None:
    """Hypothesis shrinks a failing config to a minimal one."""
    s = Scenario(seed=7, n=n, ppo_mini_batch_size=mini, require_batches=rb, trigger=trigger,
                 staleness_threshold=staleness, partial_rollout=partial, mode="sync" if sync else "async",
                 max_staleness_versions=cap, stale_policy=policy, replicas=replicas, seqs_per_call=max(n, seqs),
                 total_prompts=mini * rb * trigger * 3 + 1, val_prompts=val, test_freq=2 if val else 0,
                 actions=[Action(at, "trigger_parameter_sync_step", new_trigger)])
    out = run_scenario(s)
    assert not out.violations, out.violations


def _streaming_deaths() -> Scenario:
    """Two replicas of several calls each; replica deaths while their calls are out."""
    return Scenario(seed=11, n=2, ppo_mini_batch_size=4, trigger=2, staleness_threshold=1.0, replicas=2,
                    seqs_per_call=8, replica_rows=[8, 6], replica_calls=[4, 3], total_prompts=64,
                    long_tail=0.5, replica_deaths=[0.3, 0.9], max_replica_restarts=5)


def test_a_dead_streaming_replica_puts_back_all_its_calls(monkeypatch) -> None:
    out = run_scenario(_streaming_deaths())
    assert out.finished and not out.violations, out.violations

    def requeue_one(self, rid):  # the bug it guards: only one of the replica's dispatches put back
        self.live.discard(rid)
        self.aborted.discard(rid)
        runs = self.dispatches.pop_replica(rid)
        if runs:
            self._requeue(runs[0])
        return []

    monkeypatch.setattr(RolloutLoop, "replica_died", requeue_one)
    broken = run_scenario(_streaming_deaths())
    assert any("deadlock" in v or "livelock" in v or "ledger" in v for v in broken.violations), broken.violations


def test_the_loop_never_sends_a_replica_more_than_its_capacity(monkeypatch) -> None:
    s = Scenario(seed=12, n=2, ppo_mini_batch_size=4, staleness_threshold=2.0, replicas=1, seqs_per_call=8,
                 replica_rows=[8], replica_calls=[3], total_prompts=24)
    assert not run_scenario(s).violations
    # the bug: the rows out are not counted
    monkeypatch.setattr(DispatchTable, "room", lambda self, rid, capacity, n: capacity.room(n, 0, self.calls_on(rid)))
    assert any("capacity" in v for v in run_scenario(s).violations)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 4), mini=st.integers(1, 4), trigger=st.integers(1, 4),
       staleness=st.sampled_from([0.0, 0.5, 1.0, 3.0]), partial=st.booleans(), replicas=st.integers(1, 3),
       rows=st.lists(st.integers(1, 24), min_size=3, max_size=3),
       calls=st.lists(st.sampled_from([1, 2, 3, 12]), min_size=3, max_size=3),
       deaths=st.lists(st.floats(0.0, 3.0), max_size=2), val=st.sampled_from([0, 2]), sync=st.booleans())
def test_streaming_replicas_of_any_capacity_finish(n, mini, trigger, staleness, partial, replicas, rows, calls,
                                                   deaths, val, sync) -> None:
    s = Scenario(seed=13, n=n, ppo_mini_batch_size=mini, trigger=trigger, staleness_threshold=staleness,
                 partial_rollout=partial, mode="sync" if sync else "async", replicas=replicas,
                 seqs_per_call=max(n, 4), replica_rows=rows[:replicas], replica_calls=calls[:replicas],
                 total_prompts=mini * trigger * 3 + 1, val_prompts=val, test_freq=1 if val else 0,
                 replica_deaths=sorted(deaths), max_replica_restarts=3)
    out = run_scenario(s)
    assert not out.violations, out.violations


def _threshold_change() -> Scenario:
    return Scenario(seed=6, n=2, ppo_mini_batch_size=2, trigger=1, staleness_threshold=0.5, total_prompts=40,
                    actions=[Action(0.3, "staleness_threshold", 2.0)])


def test_the_reported_staleness_bound_follows_a_live_threshold(monkeypatch) -> None:
    out = run_scenario(_threshold_change())
    assert out.finished and not out.violations
    # the bug it guards: the trainer reported the bound of the initial threshold for the whole run
    monkeypatch.setitem(KNOBS, "staleness_threshold", dataclasses.replace(KNOBS["staleness_threshold"], followers=()))
    assert any("bound" in v for v in run_scenario(_threshold_change()).violations)


def _checkpoint_cut() -> Scenario:
    """On-demand checkpoints while long generations run: the cut aborts and drains them (begin_hold)."""
    return Scenario(seed=7, n=2, ppo_mini_batch_size=2, trigger=2, staleness_threshold=1.0, max_new_tokens=64,
                    long_tail=0.5, total_prompts=40, actions=[Action(0.3, "checkpoint"), Action(1.5, "checkpoint")])


def test_an_on_demand_checkpoint_cut_drains_and_resumes_the_replicas(monkeypatch) -> None:
    out = run_scenario(_checkpoint_cut())
    assert out.finished and not out.violations, out.violations
    monkeypatch.setattr(RolloutLoop, "end_hold", lambda self: [])  # the bug: the cut's hold never released
    broken = run_scenario(_checkpoint_cut())
    assert any("deadlock" in v or "livelock" in v for v in broken.violations), broken.violations


def _deterministic(seed: int) -> Scenario:
    return Scenario(seed=100 + seed, n=2, ppo_mini_batch_size=2, trigger=1 + seed % 3, staleness_threshold=0.5,
                    partial_rollout=False, deterministic=True, replicas=1 + seed % 2, total_prompts=24,
                    checkpoint_every_versions=seed % 3, trainer_deaths=[1.0] if seed % 4 == 0 else [])


def test_deterministic_mode_runs_clean_under_the_simulator(monkeypatch) -> None:
    for seed in range(20):
        out = run_scenario(_deterministic(seed))
        assert out.finished and not out.violations, out.violations
    # the schedule's check sees a sync that does not wait for the loaded version's work (v(k) broken)
    monkeypatch.setattr("engine.loop.deterministic.version_done", lambda loop: True)
    broken = [v for seed in range(20) for v in run_scenario(_deterministic(seed)).violations]
    assert any("deterministic" in v and "the schedule says v" in v for v in broken), broken[:5]


def test_deterministic_mode_trains_the_stream_in_order(monkeypatch) -> None:
    """The schedule's other half: prompt k is trained at local step ⌊k / R⌋ (finished groups are queued in
    admission order); with the order check taken out the simulator sees prompts trained out of turn."""
    monkeypatch.setattr("engine.loop.deterministic.ready_in_order",
                        lambda in_flight, n: [st for st in in_flight.values() if len(st.done) >= n])
    broken = [v for seed in range(20) for v in run_scenario(_deterministic(seed)).violations]
    assert any("deterministic" in v and "trained at local step" in v for v in broken), broken[:5]


def _lowered_with_a_half_pulled_batch(mode: str = "async", deterministic: bool = True) -> Scenario:
    """The issue's deadlock (`simulate --replay 1473307564` as drawn then): deterministic mode, trigger 6 lowered to
    1 live while the trainer has half a batch pulled; the owed sync must carry those groups over into the budget."""
    return Scenario(seed=1473307564, n=3, ppo_mini_batch_size=2, require_batches=2, trigger=6, staleness_threshold=0.25,
                    partial_rollout=False, mode=mode, max_staleness_versions=0, seqs_per_call=3, replica_rows=[3],
                    replica_calls=[2], total_prompts=49, max_new_tokens=64, long_tail=0.5, token_cost=0.05,
                    train_token_cost=0.01, sync_cost=0.5, deterministic=deterministic,
                    actions=[Action(103.24294160060653, "trigger_parameter_sync_step", 1)])


def test_a_lowered_interval_with_a_half_pulled_batch_carries_it_over(monkeypatch) -> None:
    out = run_scenario(_lowered_with_a_half_pulled_batch())
    assert out.finished and not out.violations, out.violations
    # the bug it was: the sync counted only queued and in-flight prompts, so dropping the groups the trainer held
    # across it freed budget never counted; the rollouter filled the queue past what its budget saw, and the
    # deterministic sync (waiting for that budget to be used up) could never come
    finish = RolloutLoop.finish_sync
    monkeypatch.setattr(RolloutLoop, "finish_sync", lambda self, version, step, held=0: finish(self, version, step))
    broken = run_scenario(_lowered_with_a_half_pulled_batch()).violations
    assert any("freed budget it never counted" in v for v in broken), broken
    monkeypatch.setattr(Checker, "on_admit", lambda self, budget: None)  # and without that check: the hang itself
    broken = run_scenario(_lowered_with_a_half_pulled_batch()).violations
    assert any("deadlock" in v and "sync=SyncState(version=3" in v for v in broken), broken


@pytest.mark.parametrize("mode,deterministic", [("async", False), ("sync", False), ("async", True)])
def test_a_lowered_interval_mid_pull_finishes_in_every_mode(mode: str, deterministic: bool) -> None:
    out = run_scenario(_lowered_with_a_half_pulled_batch(mode, deterministic))
    assert out.finished and not out.violations, out.violations


def test_the_owed_sync_reports_the_groups_the_trainer_holds() -> None:
    """Both sides agree on what carries over: the trainer's core names its buffered groups in the `Sync`, and the
    rollout core counts them with the queued and in-flight ones when it restarts the budget."""
    tr = TrainerLoop(TrainerParams(required_samples=4, trigger=6, total_local_steps=12))
    tr.local_step, tr.since_sync = 1, 1
    tr.start()
    assert tr.pulled(["g1", "g2"], closed=False) == [PollControl()]  # half a batch: the trainer polls, then pulls
    cmds = tr.control([KnobChange("trigger_parameter_sync_step", 1, 1, True)], [])
    assert cmds[-1] == Sync(1, False, held=2)
    ro = RolloutLoop(RolloutParams(n=1, max_new_tokens=4, required_samples=4, staleness_threshold=0.0, trigger=1,
                                   partial_rollout=False, seqs_per_call=1), PromptStream(1, 8), [], 1)
    ro.queue_seen(1)
    ro.begin_sync(1, 1)
    ro.finish_sync(1, 1, held=2)
    assert ro.budget.staleness_samples == 3


def _sync_mode_interval(old: int, new: int) -> Scenario:
    return Scenario(seed=3, n=2, ppo_mini_batch_size=2, trigger=old, staleness_threshold=0.0, total_prompts=64,
                    mode="sync", actions=[Action(0.4, "trigger_parameter_sync_step", new)])


@pytest.mark.parametrize("old,new", [(1, 4), (4, 1)])
def test_in_sync_mode_the_rollouter_follows_a_live_interval_at_the_sync_the_trainer_takes_it(
    monkeypatch, old: int, new: int
) -> None:
    """The rollouter follows the applied interval through its inbox (no side channel); in sync mode it holds it until
    the sync the trainer acknowledged it with, so each cycle is generated for the interval it is trained with."""
    out = run_scenario(_sync_mode_interval(old, new))
    assert out.finished and not out.violations, out.violations
    monkeypatch.setattr(RolloutKnobs, "take_held_trigger", lambda self: None)  # the rollouter never takes it
    broken = run_scenario(_sync_mode_interval(old, new)).violations
    assert any(("deadlock" if new > old else "sync-mode") in v for v in broken), broken
