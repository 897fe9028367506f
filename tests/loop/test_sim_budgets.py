"""The checker never hangs: every scenario runs under a simulated-time, an event and a stall budget
(`engine.loop.sim.bounds`), and a run that spends one is reported as a livelock with its seed and the last state of
every core. The planted bug is the issue's: `TrainerLoop.synced` without its `since_sync` reset makes the trainer
sync forever without a step; `simulate --check -n 20` then never returned."""

from __future__ import annotations

import inspect
import textwrap
import time

import pytest
from typer.testing import CliRunner

import engine.loop.trainer as trainer_module
from asyncrl_cli.app import app
from engine.loop.sim.runner import run_scenario
from engine.loop.sim.scenario import Scenario
from engine.loop.trainer import TrainerLoop

RESET = "        self.since_sync = 0\n"


@pytest.fixture
def planted(monkeypatch):
    """`TrainerLoop.synced` with its one line `self.since_sync = 0` taken out."""
    source = textwrap.dedent(inspect.getsource(TrainerLoop.synced))
    assert RESET.replace("    ", "", 1) in source, "the planted bug no longer applies: update this test"
    namespace = dict(vars(trainer_module))
    exec(source.replace(RESET.replace("    ", "", 1), "", 1), namespace)
    monkeypatch.setattr(TrainerLoop, "synced", namespace["synced"])


def test_a_livelocked_core_is_reported_within_seconds(planted) -> None:
    t0 = time.monotonic()
    result = CliRunner().invoke(app, ["simulate", "--check", "-n", "20", "--seed", "0"])
    took = time.monotonic() - t0
    assert result.exit_code == 1, result.output
    livelocks = [line for line in result.output.splitlines() if ": livelock: " in line]
    assert livelocks, result.output[-2000:]
    assert all(line.startswith("seed ") and "trainer=" in line and "rollout v=" in line for line in livelocks)
    assert took < 60, f"{took:.1f} s"  # ~6 s on one core; the bug made it hang


def _spinning(sync_cost: float) -> Scenario:
    return Scenario(seed=21, n=2, ppo_mini_batch_size=2, trigger=1, total_prompts=16, sync_cost=sync_cost)


@pytest.mark.parametrize("budget,sync_cost,says", [
    ("stall", 0.0, "without progress"),
    ("events", 0.0, "event budget"),
    ("time", 0.05, "simulated-time budget"),
])
def test_each_budget_ends_a_livelock_on_its_own(planted, monkeypatch, budget: str, sync_cost: float,
                                                says: str) -> None:
    """With the other budgets lifted, each one alone still ends the run (a sync of no cost spins at one instant:
    only the stall and event budgets see it; a costly one also moves time)."""
    huge = 10**12
    if budget != "stall":
        monkeypatch.setattr("engine.loop.sim.world.stall_bound", lambda s: huge)
    if budget == "time":
        monkeypatch.setattr("engine.loop.sim.world.event_bound", lambda s: huge)
    out = run_scenario(_spinning(sync_cost))
    assert not out.finished
    assert any(v.startswith("seed 21: livelock: ") and says in v for v in out.violations), out.violations


def test_a_correct_run_stays_well_inside_its_budgets() -> None:
    from engine.loop.sim.world import World

    w = World(_spinning(0.05))
    out = w.run()
    assert out.finished and not out.violations
    assert out.events * 4 < w.event_bound and out.sim_time * 4 < w.bound
