"""One `LoopParams` per config (`engine.loop.params.loop_params`): the run, `asyncrl plan` and the simulator take
the same loop cores' parameters, and the plan models what the loop does with them — deterministic mode, partial
rollout as the run has it, dynamic sampling (a keep rate) and multi-turn turn limits."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from asyncrl_cli.config import load_run_config
from engine.config.schema import RunConfig
from engine.loop.params import loop_params
from engine.loop.sim.costed import CostedWorld
from engine.loop.sim.scenario import draw
from engine.plan.run_plan import resolve_plan
from engine.predict.costs import CostModel, Layout, resolve
from engine.predict.prediction import scenario, simulate, sync_layout

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "presets" / "runs" / "tiny-cpu.toml"
TOOLS = ROOT / "presets" / "runs" / "tiny-tools-cpu.toml"
COSTS = dict(decode_step_s=0.01, row_step_s=0.0, prefill_token_s=0.0, train_token_s=0.0, train_step_s=0.05,
             train_world=1, sync_s=0.01, long_tail=0.1, short_max=2)


def config(preset: Path = TINY, *overrides: str) -> RunConfig:
    res = load_run_config(preset, list(overrides))
    assert res.config is not None, [str(p) for p in res.problems]
    return res.config


def test_each_core_s_parameters_are_constructed_in_one_place() -> None:
    sites = {"RolloutParams": [], "TrainerParams": []}
    for path in (ROOT / "engine").rglob("*.py"):
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for name in sites:
                if re.search(rf"\b{name}\(", line) and not line.lstrip().startswith("class "):
                    sites[name].append(f"{path.relative_to(ROOT)}:{i}")
    assert [s.split(":")[0] for s in sites["RolloutParams"]] == ["engine/loop/params.py"], sites
    assert [s.split(":")[0] for s in sites["TrainerParams"]] == ["engine/loop/params.py"], sites


@pytest.mark.parametrize("overrides", [(), ("trainer.deterministic=true",), ("algorithm.filter_groups.enable=true",),
                                       ("async_training.mode=sync", "async_training.staleness_threshold=0")])
def test_the_run_and_the_plan_start_the_same_loop(overrides: tuple[str, ...]) -> None:
    cfg = config(TINY, *overrides)
    roles = resolve_plan(cfg, cores=2).role_specs()
    layout = Layout.from_config(cfg, None, "cpu")
    assert layout.loop.rollout == roles.rollout.params
    assert layout.loop.trainer == roles.trainer.params


def test_deterministic_mode_turns_partial_rollout_off_in_the_plan_as_in_the_run() -> None:
    async_ = Layout.from_config(config(TINY), None, "cpu")
    det = Layout.from_config(config(TINY, "trainer.deterministic=true"), None, "cpu")
    assert async_.partial_rollout and not det.partial_rollout  # the old plan kept it on here
    assert det.loop.rollout.deterministic and det.loop.trainer.ordered
    assert det.seqs_per_call == det.n and det.slots == 1  # the hf sampler generates each group alone
    s = scenario(det, CostModel(**COSTS), versions=4)
    assert s.deterministic and not s.partial_rollout and s.seqs_per_call == det.n
    assert sync_layout(det).loop == det.baseline and det.baseline.sync_mode and det.baseline.rollout.deterministic


def test_the_simulator_rebuilds_the_plans_loop_through_the_same_function() -> None:
    """A plan's scenario holds the config values of its LoopParams; the simulator turns them back into the same
    params (the window's length set by `for_versions`, a replica's rows split over its slots)."""
    for overrides in [(), ("algorithm.filter_groups.enable=true",), ("trainer.deterministic=true",)]:
        layout = Layout.from_config(config(TINY, "trainer.test_freq=0", *overrides), None, "cuda")
        costs = CostModel(**COSTS, keep_rate=0.5)
        s = scenario(layout, costs, versions=5, resolution=10_000)
        want = layout.loop.for_versions(5, 0.5 if layout.loop.dynamic_sampling else 1.0)
        got = s.loop()
        assert got.trainer == want.trainer and got.total_rollout_steps == want.total_rollout_steps
        rows = max(layout.n, layout.seqs_per_call // layout.slots)  # a replica of k slots: k replicas of rows / k
        assert got.rollout == dataclasses.replace(want.rollout, seqs_per_call=rows)


def test_a_simulated_scenario_gets_its_loop_from_the_runs_function() -> None:
    s = draw(11)
    assert s.loop() == loop_params(s.config(), s.total_prompts)


def test_dynamic_sampling_costs_one_over_the_keep_rate_generated_groups() -> None:
    layout = Layout.from_config(config(TINY, "algorithm.filter_groups.enable=true", "trainer.test_freq=0"), None,
                                "cuda")
    assert layout.loop.dynamic_sampling
    runs = {}
    for keep in (1.0, 0.5, 0.25):
        costs = resolve(layout, calibration={"costs": COSTS}, keep_rate=keep)
        assert costs.keep_rate == keep and costs.sources["keep_rate"] == "--keep-rate"
        assert any(n.startswith("dynamic sampling: ") for n in costs.notes)
        runs[keep] = simulate(layout, costs)
        assert not runs[keep].violations
        world = CostedWorld(scenario(layout, costs, versions=8))
        out = world.run()
        assert out.finished and out.steps == 8 and world.trained_prompts == 8 * 32
        # groups generated (put into the queue) per group trained: 1 / K
        assert world.rollout.total_generated * keep / world.trained_prompts == pytest.approx(1.0, abs=0.15)
    assert runs[1.0].step_time_s < runs[0.5].step_time_s < runs[0.25].step_time_s
    default = resolve(layout, calibration={"costs": COSTS})
    assert default.keep_rate == 1.0 and default.sources["keep_rate"] == "default"
    assert "keep_rate" not in resolve(Layout.from_config(config(TINY), None, "cuda"),
                                      calibration={"costs": COSTS}).sources  # no dynamic sampling, no figure


def test_a_multi_turn_plan_runs_the_loops_turn_limits_with_tool_calls() -> None:
    cfg = config(TOOLS, "trainer.test_freq=0")
    layout = Layout.from_config(cfg, None, "cuda")
    agent = layout.loop.rollout.agent
    assert agent is not None and agent.max_assistant_turns == cfg.rollout.multi_turn.max_assistant_turns
    costs = resolve(layout, calibration={"costs": COSTS})
    assert any(n.startswith("multi-turn: ") for n in costs.notes)
    s = scenario(layout, costs, versions=4)
    assert s.multi_turn and s.max_assistant_turns == agent.max_assistant_turns and s.tool_call_p > 0
    p = simulate(layout, costs)
    assert not p.violations and p.step_time_s > 0
