"""Elastic cores (`engine.loop.elastic`): the lending decision from the wait events, its invariant, and the
simulator's check of it over random scenarios (`asyncrl simulate --check` draws elastic cores in about half of
its scenarios, so `tests/loop/test_simulator.py`'s 2000-scenario check covers it too)."""

from __future__ import annotations

import random

import pytest

from engine.loop.commands import SetThreads
from engine.loop.elastic import ElasticCores, ElasticParams
from engine.loop.sim import world as sim_world
from engine.loop.sim.runner import run_scenario
from engine.loop.sim.scenario import Scenario, draw


def _core(t: int = 1, r: int = 1, replicas: int = 1, enabled: bool = True) -> ElasticCores:
    return ElasticCores(ElasticParams(t, r, 1, replicas, enabled))


def test_a_waiting_trainer_lends_its_threads_to_the_replicas() -> None:
    c = _core()
    assert c.trainer(False, 1) == [SetThreads("rollout", 2)]
    assert c.granted == {"trainer": 1, "rollout": 2}


def test_the_lender_gets_its_threads_back_before_it_computes() -> None:
    c = _core()
    c.trainer(False, 1)
    cmds = c.trainer(True, 2)
    assert cmds == [SetThreads("rollout", 1)]  # reclaimed in the answer to the step's start, before it trains
    assert c.granted == {"trainer": 1, "rollout": 1}


def test_a_waiting_rollout_lends_to_the_trainer_and_takes_it_back_when_it_dispatches() -> None:
    c = _core(t=1, r=2, replicas=2)
    assert c.rollout(False) == [SetThreads("trainer", 5)]  # 1 + 2 replicas × 2
    assert c.rollout(True) == [SetThreads("trainer", 1)]


def test_a_switch_of_borrower_comes_back_to_the_split_between() -> None:
    c = _core(t=2, r=1, replicas=2)
    assert c.rollout(False) == [SetThreads("trainer", 4)]  # the trainer borrows both replicas' threads
    assert c.trainer(False, 1) == [SetThreads("trainer", 2)]  # both wait: the split
    assert c.rollout(True) == [SetThreads("rollout", 2)]  # the rollout computes alone: 1 + 2 // 2 per replica
    assert c.trainer(True, 2) == [SetThreads("rollout", 1)]  # the trainer's threads come back first


def test_off_issues_no_command_for_any_sequence() -> None:
    c = _core(enabled=False)
    rng = random.Random(0)
    for seq in range(200):
        cmds = c.trainer(rng.random() < 0.5, seq) if rng.random() < 0.5 else c.rollout(rng.random() < 0.5)
        assert cmds == []
    assert c.granted == {"trainer": 1, "rollout": 1}


def test_an_overtaken_trainer_report_is_ignored() -> None:
    c = _core()
    c.trainer(True, 5)
    assert c.trainer(False, 4) == []  # the wait sent before the step's start arrived after it
    assert c.computing["trainer"] is True


@pytest.mark.parametrize("seed", range(20))
def test_the_granted_threads_never_exceed_the_pools_cores(seed: int) -> None:
    rng = random.Random(seed)
    c = _core(rng.randint(1, 4), rng.randint(1, 3), rng.randint(1, 3))
    for seq in range(300):
        if rng.random() < 0.5:
            c.trainer(rng.random() < 0.5, seq)
        else:
            c.rollout(rng.random() < 0.5)
        assert c.in_use() <= c.cores
        assert all(c.granted[r] >= c.base[r] for r in c.granted)  # nobody computes below its share


def test_the_simulator_catches_a_core_that_never_reclaims(monkeypatch: pytest.MonkeyPatch) -> None:
    """Take out the reclaim (a borrower keeps what it borrowed when the lender computes again): the checker
    reports threads beyond the cores past the borrower's boundary."""

    class Greedy(ElasticCores):
        def target(self) -> dict[str, int]:
            t = super().target()
            return {k: max(v, self.granted[k]) for k, v in t.items()}

    monkeypatch.setattr(sim_world, "ElasticCores", Greedy)
    s = Scenario(seed=3, n=2, ppo_mini_batch_size=2, trigger=1, staleness_threshold=0.5, total_prompts=24,
                 train_token_cost=0.01, token_cost=0.01, elastic_cores=True)
    out = run_scenario(s)
    assert any(": threads:" in v for v in out.violations), out.violations


def test_about_half_the_drawn_scenarios_lend_cores() -> None:
    drawn = [draw(s) for s in range(400)]
    share = sum(s.elastic_cores for s in drawn) / len(drawn)
    assert 0.35 < share < 0.65
    clean = [run_scenario(s) for s in drawn[:200] if s.elastic_cores]
    assert all(not o.violations for o in clean), [o.violations[:1] for o in clean if o.violations][:3]
