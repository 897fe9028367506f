"""`RunPlan`: the one typed object the CLI hands the engine — M, R, the placement and the Ray resources come
from one resolution, and a layout the pools cannot hold is refused by the driver before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncrl_cli.config import load_run_config
from engine.config.schema import RunConfig
from engine.plan.run_plan import RunPlan, resolve_plan

TINY = Path(__file__).resolve().parents[2] / "presets" / "runs" / "tiny-cpu.toml"


def tiny(*overrides: str) -> RunConfig:
    res = load_run_config(TINY, list(overrides))
    assert res.config is not None, [str(p) for p in res.problems]
    return res.config


def test_one_resolution_gives_the_counts_the_layout_and_the_ray_asks() -> None:
    cfg = tiny("resources.trainer.gpus_per_node=2", "resources.rollout.gpus_per_node=3", "rollout.replicas=3")
    plan = resolve_plan(cfg, cores=8)
    assert isinstance(plan, RunPlan) and plan.config is cfg and plan.device == "cpu"
    assert (plan.trainer_ranks, plan.replicas) == (2, 3)
    assert (plan.actors["trainer_ranks"], plan.actors["replicas"]) == (2, 3)
    groups = {g.name: g.count for g in plan.placement.actors}
    assert groups["TrainerWorker"] == 2 and groups["RolloutReplica"] == 3
    # the cores split the driver asks Ray for: the replicas share half, the trainer ranks the rest
    assert plan.actors["replica_threads"] == 1 and plan.actors["trainer_threads"] == (8 - 3) // 2
    assert plan.total_local_steps() == plan.derived.total_local_steps > 0
    assert plan.layout_error is None


def test_a_layout_the_nodes_cannot_hold_is_refused_by_the_driver_in_one_line() -> None:
    from engine.runtime import driver

    cfg = tiny('resources.hardware="h100"', "resources.rollout.gpus_per_node=2")
    cfg.rollout.tensor_parallel_size = 4  # past `validate`, as an engine caller could build it
    plan = resolve_plan(cfg)
    assert plan.device == "cuda" and "does not fit a node of 2" in str(plan.layout_error)
    with pytest.raises(driver.RunFailed, match="does not fit a node of 2") as err:
        driver._placement(plan)
    assert "\n" not in str(err.value)


def test_the_driver_copies_the_plan_it_adds_to() -> None:
    from engine.runtime import driver

    plan = resolve_plan(tiny(), cores=2)
    placement = driver._placement(plan)
    placement["replica_res"]["num_cpus"] = 99
    assert plan.actors["replica_res"]["num_cpus"] == 1  # the plan stays what dry-run showed


def test_the_unknown_data_size_is_one_line() -> None:
    cfg = tiny()
    plan = resolve_plan(cfg)
    unknown = RunPlan(cfg, type(plan.derived)(**{**plan.derived.to_json(), "total_local_steps": None}),
                      plan.hardware, plan.placement, plan.actors)
    with pytest.raises(ValueError, match="set trainer.total_steps"):
        unknown.total_local_steps()
