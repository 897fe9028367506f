"""The typed parts of the role specs (`engine.plan.role_parts`) and the driver's launch context
(`engine.runtime.launch_context`): each actor gets what its role uses, computed once by the plan — never the whole
run config — and the trainer's precision policy is the plan's."""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from asyncrl_cli.config import load_run_config
from engine.config.precision import PrecisionPolicy
from engine.config.schema import RunConfig
from engine.plan.devices import RoleDevice
from engine.plan.run_plan import resolve_plan

TINY = Path(__file__).resolve().parents[2] / "presets" / "runs" / "tiny-cpu.toml"


def tiny(*overrides: str) -> RunConfig:
    res = load_run_config(TINY, list(overrides))
    assert res.config is not None, [str(p) for p in res.problems]
    return res.config


def values(obj: Any, path: str = "spec") -> list[tuple[str, Any]]:
    """Every value reachable through dataclass fields, config sections, lists and dicts, with its path."""
    out = [(path, obj)]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            out += values(getattr(obj, f.name), f"{path}.{f.name}")
    elif isinstance(obj, BaseModel):
        for name in type(obj).model_fields:
            out += values(getattr(obj, name), f"{path}.{name}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            out += values(v, f"{path}[{i}]")
    elif isinstance(obj, dict):
        for k, v in obj.items():
            out += values(v, f"{path}[{k!r}]")
    return out


def test_no_role_spec_carries_the_run_config_and_every_spec_travels_to_an_actor() -> None:
    cfg = tiny("rollout.multi_turn.enable=true", 'rollout.multi_turn.tools=["calculator"]')
    roles = resolve_plan(cfg).role_specs()
    found = values(roles)
    assert not [p for p, v in found if isinstance(v, RunConfig)]
    assert not [p for p, _ in found if p.rsplit(".", 1)[-1] == "config"]
    for spec in (roles.rollout, roles.replica, roles.trainer):  # Ray pickles each actor's spec
        assert pickle.loads(pickle.dumps(spec)) == spec
        with pytest.raises(dataclasses.FrozenInstanceError):
            spec.threads = 3  # type: ignore[misc]  # noqa: B018 (frozen)


def test_the_precision_policy_and_dtypes_are_the_plans() -> None:
    backend = resolve_plan(tiny('trainer.precision="bf16"', 'rollout.dtype="fp32"')).role_specs().trainer.backend
    assert backend.precision == PrecisionPolicy(params="float32", compute="bfloat16", grad_reduce="float32",
                                                optimizer="float32")
    assert backend.export_dtype == "float32"  # the weights go out in the replicas' dtype
    pure = resolve_plan(tiny('trainer.precision="bf16"', "trainer.fp32_master_weights=false")).role_specs()
    assert pure.trainer.backend.precision.params == "bfloat16"


def test_auto_settings_stay_undecided_until_the_launch_and_no_backend_is_built_from_them() -> None:
    from engine.runtime.backends import build_rollout_backend, build_trainer_backend

    roles = resolve_plan(tiny('trainer.precision="auto"', 'rollout.dtype="auto"')).role_specs()
    assert roles.trainer.backend.precision is None and roles.replica.engine.dtype is None
    with pytest.raises(ValueError, match='trainer.precision = "auto" is decided at launch'):
        build_trainer_backend(roles.trainer.backend, "/nonexistent", device=RoleDevice("cpu", "none"))
    with pytest.raises(ValueError, match='rollout.dtype = "auto" is decided at launch'):
        build_rollout_backend(roles.replica.engine, "/nonexistent", RoleDevice("cpu", "none"))


def test_each_role_gets_the_settings_it_uses(tmp_path: Path) -> None:
    cfg = tiny("rollout.temperature=0.7", "rollout.top_k=5", "rollout.val_temperature=0", "trainer.seed=11",
               'data.reward_manager="dapo"', "data.overlong_buffer.enable=true", "data.overlong_buffer.len=2",
               "data.overlong_buffer.penalty_factor=0.5", "debug.kill_trainer_at_step=3", "checkpoint.keep_last=4",
               "async_training.require_batches=2", "trainer.clip_ratio_high=0.28",
               "algorithm.rollout_correction.bypass_mode=false", "rollout.max_replica_restarts=5")
    roles = resolve_plan(cfg).role_specs()
    ro, tr = roles.rollout, roles.trainer
    assert (ro.sampling.temperature, ro.sampling.top_k, ro.sampling.seed) == (0.7, 5, 11)
    assert ro.val_sampling.temperature == 0.0 and ro.val_sampling.seed == 11
    assert ro.scoring.overlong is not None and (ro.scoring.overlong.len, ro.scoring.overlong.penalty_factor) == (2, 0.5)
    assert ro.tools is None and ro.max_replica_restarts == 5 and ro.prompts.data == cfg.data
    assert tr.faults.kill_trainer_at_step == 3 and ro.faults.kill_replica_at_step == 0
    assert tr.checkpoint.keep_last == 4 and tr.checkpoint.root(tmp_path) == tmp_path / "checkpoints"
    assert tr.checkpoint.fingerprint["rollout.n"] == cfg.rollout.n
    assert tr.backend.update.mini_batches == 2 and tr.backend.seed == 11
    assert tr.loss.clip_ratio_high == 0.28 and tr.loss.rollout_correction.bypass_mode is False
    assert roles.replica.engine.max_model_len == cfg.data.max_prompt_length + cfg.data.max_response_length


def test_the_launch_context_binds_the_plans_specs_to_the_launch(tmp_path: Path) -> None:
    from engine.control.registry import RunEntry
    from engine.runtime.launch_context import ActorPlacement, LaunchContext, LaunchOptions, StopContext
    from engine.runtime.stop_signals import StopSignals

    plan = resolve_plan(tiny())
    slots = [{"num_cpus": 1, "slot": i} for i in range(plan.replicas)]
    placement = ActorPlacement.of({**plan.actors, "replica_options": slots})
    assert placement.replica(0) == slots[0] and placement.rank0() == plan.actors["trainer_res"]
    stop = StopContext(StopSignals(), None, 0, tmp_path / "checkpoints", tmp_path, ["asyncrl", "launch", "x.toml"])
    launch = LaunchContext(plan, RunEntry("tiny-1", "tiny"), LaunchOptions(), tmp_path, "/models/tiny", {}, {},
                           placement, stop)
    roles = launch.roles()
    assert roles.trainer.run_dir == str(tmp_path) and roles.replica.model_dir == "/models/tiny"
    assert roles.rollout.replica_options == slots and roles.trainer.resume is None
    assert "no checkpoint exists" in stop.resume_hint()
    with pytest.raises(dataclasses.FrozenInstanceError):
        launch.run_dir = tmp_path  # type: ignore[misc]


def test_a_sequence_level_loss_mode_reaches_the_loss_and_the_micro_batch_weights() -> None:
    """GSPO aggregates per sequence: the trainer's loss gets the mode and prepare_batch weights micro-batches by
    rows, whatever loss_agg_mode names (else gradient accumulation would weigh micro-batches by tokens)."""
    from engine.algo.loss import build_loss_fn

    trainer = resolve_plan(tiny('trainer.loss_mode="gspo"')).role_specs().trainer
    assert trainer.loss.loss_mode == "gspo" and trainer.batch.loss_agg_mode == "seq-mean-token-mean"
    loss = build_loss_fn(trainer.loss, trainer.loss.rollout_correction)
    assert (loss.loss_mode, loss.loss_agg_mode) == ("gspo", "seq-mean-token-mean")
