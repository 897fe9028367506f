"""CPU placement (`engine.runtime.driver._placement` of a `RunPlan`): how the cores are shared between trainer and replicas."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from run_helpers import tiny_config

from engine.plan.run_plan import resolve_plan
from engine.runtime import driver


@pytest.fixture
def two_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 2)  # the plan reads this machine's cores


def test_fully_async_splits_the_cores_and_waits_passively(tmp_path: Path, two_cores: None) -> None:
    p = driver._placement(resolve_plan(tiny_config(tmp_path)))
    assert (p["trainer_threads"], p["replica_threads"]) == (1, 1)  # 2 cores, never oversubscribed
    for res in (p["trainer_res"], p["replica_res"]):
        assert res["runtime_env"]["env_vars"]["OMP_WAIT_POLICY"] == "PASSIVE"


def test_sync_mode_gives_each_phase_every_core(tmp_path: Path, two_cores: None) -> None:
    p = driver._placement(resolve_plan(tiny_config(tmp_path, 'async_training.mode="sync"',
                                                   "async_training.staleness_threshold=0",
                                                   "async_training.partial_rollout=false")))
    assert (p["trainer_threads"], p["replica_threads"]) == (2, 2)
    assert "runtime_env" not in p["trainer_res"]  # the phases alternate: spinning waits cost nothing


def test_cpu_threads_overrides_the_split(tmp_path: Path, two_cores: None) -> None:
    p = driver._placement(resolve_plan(tiny_config(tmp_path, 'resources.trainer.cpu_threads="all"',
                                                   "resources.rollout.cpu_threads=1")))
    assert (p["trainer_threads"], p["replica_threads"]) == (2, 1)


def test_trainer_ranks_share_the_trainer_cores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    p = driver._placement(resolve_plan(tiny_config(tmp_path, "resources.trainer.gpus_per_node=2")))
    assert p["trainer_ranks"] == 2
    assert (p["trainer_threads"], p["replica_threads"]) == (2, 4)  # replicas 8 // 2; ranks (8 - 4) // 2


def test_negative_cpu_threads_is_a_config_error(tmp_path: Path) -> None:
    from asyncrl_cli.config import load_run_config

    res = load_run_config(Path(__file__).resolve().parents[2] / "presets/runs/tiny-cpu.toml",
                          ["resources.trainer.cpu_threads=-1"])
    assert res.config is None
    assert any("cpu_threads" in str(p.key) + p.message for p in res.problems)


@pytest.mark.parametrize(("hardware", "ask"), [("h100", {"num_gpus": 1}), ("ascend-910b", {"resources": {"NPU": 1}})])
def test_accelerator_presets_ask_ray_for_their_accelerators(tmp_path: Path, hardware: str, ask: dict) -> None:
    """GPUs are Ray's `num_gpus`; Ascend NPUs are Ray's "NPU" resource (asking NPU actors for GPUs would never place)."""
    p = driver._placement(resolve_plan(tiny_config(tmp_path, f'resources.hardware="{hardware}"')))
    env = {"HCCL_CONNECT_TIMEOUT": "1200"} if hardware.startswith("ascend") else {}  # the preset's collective env
    for role in ("trainer_res", "replica_res"):
        assert p[role].pop("runtime_env", {}).get("env_vars", {}) == env
        assert p[role] == {**ask, "num_cpus": 1}
