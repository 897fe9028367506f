"""The derived quantities of the contract, on verl's worked examples."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.plan.sizes import derive, max_queue_size, required_samples
from asyncrl_cli.config.loader import load_run_config
from engine.config.schema import RunConfig

RUNS = Path(__file__).resolve().parents[2] / "presets" / "runs"


def cfg(**sections: dict) -> RunConfig:
    base = {"model": {"path": "builtin:tiny-qwen"}, "data": {"train_files": ["not-here.parquet"]}}
    return RunConfig.model_validate({**base, **sections})


def test_verl_readme_7b_example() -> None:
    # mini 32 × require 4 = 128 prompts; trigger 4 → 512 per version; staleness 0.5 → 768; 512×400 → 400
    c = cfg(
        trainer={"ppo_mini_batch_size": 32},
        async_training={"require_batches": 4, "trigger_parameter_sync_step": 4, "staleness_threshold": 0.5},
        rollout={"total_rollout_steps": 512 * 400},
    )
    d = derive(c)
    assert (d.required_samples, d.max_required_samples, d.max_queue_size) == (128, 768, 768)
    assert (d.prompts_per_version, d.total_train_steps, d.total_local_steps) == (512, 400, 1600)


def test_geo3k_seed_example() -> None:
    c = cfg(
        trainer={"ppo_mini_batch_size": 64},
        async_training={"require_batches": 2, "trigger_parameter_sync_step": 4, "staleness_threshold": 0.1},
        rollout={"total_rollout_steps": 51200},
    )
    d = derive(c)
    assert d.max_required_samples == int(128 * 1.1 * 4) == 563
    assert d.total_train_steps == 100


def test_sync_mode_forces_staleness_zero() -> None:
    c = cfg(async_training={"mode": "sync", "staleness_threshold": 0.5, "trigger_parameter_sync_step": 2})
    assert derive(c).staleness_threshold == 0.0
    assert max_queue_size(c) == required_samples(c) * 2


def test_total_steps_overrides_and_data_size_bounds() -> None:
    c = cfg(trainer={"total_steps": 7}, rollout={"total_rollout_steps": 10**9})
    assert derive(c).total_train_steps == 7
    small = cfg(
        data={"train_files": ["builtin:copy"], "train_size": 100},
        trainer={"ppo_mini_batch_size": 10, "total_epochs": 2},
        async_training={"trigger_parameter_sync_step": 1},
        rollout={"total_rollout_steps": 10**6},
    )
    d = derive(small)
    assert d.total_rollout_steps == 200 and d.total_train_steps == 20


def test_the_plan_refuses_to_size_a_run_nothing_bounds() -> None:
    from engine.plan.run_plan import resolve_plan

    c = RunConfig.model_validate(
        {"model": {"path": "x/y"}, "data": {"train_files": ["/nonexistent.parquet"]}}
    )
    plan = resolve_plan(c)
    assert plan.roles is None
    with pytest.raises(ValueError, match="total_local_steps cannot be derived"):
        plan.role_specs()


@pytest.mark.parametrize("name", ["tiny-cpu", "smollm2-arith-cpu", "qwen3-30b-a3b-base-dapo-megatron-96-32"])
def test_presets_have_the_intended_lengths(name: str) -> None:
    c, _, problems = load_run_config(RUNS / f"{name}.toml")
    assert c is not None, [p.render() for p in problems]
    expected = {"tiny-cpu": 400, "smollm2-arith-cpu": 20, "qwen3-30b-a3b-base-dapo-megatron-96-32": 1600}[
        name
    ]
    assert derive(c).total_local_steps == expected
