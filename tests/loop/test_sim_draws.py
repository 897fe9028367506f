"""What `asyncrl simulate --check` draws: the wider space (bursts of live knob changes, deterministic mode with
multi-turn tools and deaths, faults and actions at one instant) is drawn often enough to be searched, and the
hard corners of it run clean. The 100 000-scenario search is the slow test at the end."""

from __future__ import annotations

from collections import Counter

import pytest
from typer.testing import CliRunner

from asyncrl_cli.app import app
from engine.loop.sim.runner import run_scenario, scenario_seeds
from engine.loop.sim.scenario import draw

KNOBS = {"trigger_parameter_sync_step", "staleness_threshold", "paused"}


def _tally(count: int, seed: int) -> Counter:
    seen: Counter = Counter()
    for s in scenario_seeds(count, seed):
        sc = draw(s)
        knobs = [a for a in sc.actions if a.name in KNOBS]
        seen["several knobs"] += len({a.name for a in knobs}) >= 2 and len(knobs) >= 3
        seen["one instant"] += len({a.at for a in knobs}) < len(knobs)
        seen["deterministic multi-turn"] += sc.deterministic and sc.multi_turn
        seen["deterministic with deaths"] += sc.deterministic and bool(sc.trainer_deaths) and bool(sc.replica_deaths)
        seen["deterministic multi-turn with deaths"] += sc.deterministic and sc.multi_turn and bool(
            sc.trainer_deaths or sc.replica_deaths)
        seen["death with an action"] += bool({a.at for a in sc.actions} & set(sc.trainer_deaths + sc.replica_deaths))
        paused = [a for a in sorted(sc.actions, key=lambda a: a.at) if a.name == "paused"]
        seen["left paused"] += bool(paused) and paused[-1].value is True
    return seen


def test_the_check_draws_the_wider_space() -> None:
    seen = _tally(2000, 17)
    assert seen["several knobs"] > 400, seen  # several live knob changes in one scenario
    assert seen["one instant"] > 50, seen
    assert seen["deterministic multi-turn"] > 100 and seen["deterministic multi-turn with deaths"] > 50, seen
    assert seen["deterministic with deaths"] > 50 and seen["death with an action"] > 50, seen
    assert seen["left paused"] == 0, seen  # a pause is always resumed: a paused end is the operator's, not a hang


def test_deterministic_multi_turn_with_deaths_runs_clean() -> None:
    """The pair `validate` refuses still has to be live and exact in the cores: ledger, staleness, tool waits,
    and (without timed knob changes) the deterministic schedule."""
    ran = 0
    for s in scenario_seeds(3000, 23):
        sc = draw(s)
        if not (sc.deterministic and sc.multi_turn and (sc.trainer_deaths or sc.replica_deaths)):
            continue
        out = run_scenario(sc)
        assert not out.violations, out.violations
        ran += 1
        if ran == 25:
            break
    assert ran == 25


def test_replaying_the_issue_seed_ends_normally() -> None:
    result = CliRunner().invoke(app, ["simulate", "--replay", "1473307564"])
    assert result.exit_code == 0 and "violation" not in result.output and "deadlock" not in result.output, \
        result.output


def test_workers_split_the_same_scenarios() -> None:
    one = CliRunner().invoke(app, ["simulate", "--check", "-n", "40", "--seed", "9"])
    two = CliRunner().invoke(app, ["simulate", "--check", "-n", "40", "--seed", "9", "--workers", "2"])
    assert one.exit_code == two.exit_code == 0, (one.output, two.output)
    assert one.output.split("(")[0] == two.output.split("(")[0]
    assert one.output.split(";")[1] == two.output.split(";")[1]  # the same multi-turn scenarios and tool answers


@pytest.mark.slow
def test_a_hundred_thousand_scenarios_from_a_fresh_seed() -> None:
    result = CliRunner().invoke(app, ["simulate", "--check", "--scenarios", "100000", "--seed", "20261206",
                                      "--workers", "0"])
    assert result.exit_code == 0 and "100000 scenarios, 0 violations" in result.output, result.output[-3000:]
