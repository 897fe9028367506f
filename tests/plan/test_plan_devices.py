"""Every backend is told its device by the run plan: the vLLM engine arguments, the process groups and the scalar
reductions built for the `h100`, `ascend-910b` and `cpu` hardware presets (no accelerator needed: what is checked
is what each backend would hand to vLLM and torch.distributed)."""

from __future__ import annotations

import itertools
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from asyncrl_cli.config import load_run_config
from engine.plan.devices import (
    COLLECTIVE_BACKEND,
    RAY_NOSET_ENV,
    REDUCE_DTYPES,
    RoleDevice,
    group_backends,
    process_group_backend,
    reduction,
)
from engine.plan.run_plan import resolve_plan
from engine.rollout.vllm.backend import engine_args
from engine.runtime.backends import vllm_options
from engine.trainer import process_groups

TINY = Path(__file__).resolve().parents[2] / "presets" / "runs" / "tiny-cpu.toml"


def plan_for(hardware: str, *overrides: str):
    res = load_run_config(TINY, [f'resources.hardware="{hardware}"', 'rollout.backend="vllm"',
                                 "rollout.gpu_memory_utilization=0.7", *overrides])
    assert res.config is not None, [str(p) for p in res.problems]
    return resolve_plan(res.config, cores=8)


@pytest.mark.parametrize(("hardware", "device"), [("h100", "cuda"), ("ascend-910b", "npu")])
def test_vllm_engine_args_on_an_accelerator_preset_carry_its_device_and_memory_settings(hardware, device) -> None:
    plan = plan_for(hardware)
    role = plan.devices["rollout"]
    assert role.type == device and role.index_policy == "ray"
    options = vllm_options(plan.role_specs().replica.engine, role)
    args = engine_args("/m", **options)
    assert options["device"] == device
    assert args["gpu_memory_utilization"] == 0.7  # the KV cache is a share of the accelerator's memory
    assert "kv_cache_memory_bytes" not in args  # not the 1 GiB CPU cache (two sequences of a 7B run)
    assert args["enforce_eager"] is False and args["enable_sleep_mode"] is True  # graphs; KV released at a sync
    assert args.get("distributed_executor_backend") is None


def test_vllm_engine_args_on_the_cpu_preset_size_a_cpu_kv_cache_and_run_eager() -> None:
    plan = plan_for("cpu")
    args = engine_args("/m", **vllm_options(plan.role_specs().replica.engine, plan.devices["rollout"]), kv_cache_gib=0.5)
    assert args["kv_cache_memory_bytes"] == 1 << 29 and args["enforce_eager"] is True
    assert "gpu_memory_utilization" not in args and "enable_sleep_mode" not in args


def test_a_tp2_replica_spreads_over_its_bundles_and_keeps_its_visible_devices_whatever_ray_does() -> None:
    plan = plan_for("h100", "rollout.tensor_parallel_size=2", "resources.rollout.gpus_per_node=2")
    role = plan.devices["rollout"]
    assert role.index_policy == "bundles" and plan.devices["trainer"].index_policy == "ray"
    assert engine_args("/m", **vllm_options(plan.role_specs().replica.engine, role))["distributed_executor_backend"] == "ray"
    # the replica actor holds no GPU (`num_gpus=0`): Ray must not blank CUDA_VISIBLE_DEVICES for it
    env = plan.actors["replica_res"]["runtime_env"]["env_vars"]
    assert env[RAY_NOSET_ENV["cuda"]] == "1"
    assert RAY_NOSET_ENV["cuda"] not in plan.actors["trainer_res"].get("runtime_env", {}).get("env_vars", {})


def test_collective_env_travels_to_every_rank_and_replica(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HCCL_BUFFSIZE", "400")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # not a collective setting: never copied
    plan = plan_for("ascend-910b", 'resources.collective_env={GLOO_SOCKET_IFNAME="eth1", HCCL_CONNECT_TIMEOUT="600"}')
    want = {"HCCL_BUFFSIZE": "400", "GLOO_SOCKET_IFNAME": "eth1", "HCCL_CONNECT_TIMEOUT": "600"}  # config > preset
    for key in ("replica_res", "trainer_res"):
        assert plan.actors[key]["runtime_env"]["env_vars"] == want
    assert dict(plan.devices["trainer"].env) == want
    assert plan_for("ascend-910b").devices["trainer"].env["HCCL_CONNECT_TIMEOUT"] == "1200"  # the preset's default


@pytest.mark.parametrize(("hardware", "spec"), [("cpu", "gloo"), ("h100", "cpu:gloo,cuda:nccl"),
                                                ("ascend-910b", "cpu:gloo,npu:hccl")])
def test_trainer_groups_have_a_gloo_side_for_cpu_metadata(hardware: str, spec: str) -> None:
    role = plan_for(hardware).devices["trainer"]
    assert role.process_group_backend() == spec
    assert group_backends(spec)["cpu"] == "gloo"


GROUPS = sorted({process_group_backend(d) for d in COLLECTIVE_BACKEND} | set(COLLECTIVE_BACKEND.values())
                | {"npu:hccl", "cuda:nccl"})


@pytest.mark.parametrize(("device", "group"), list(itertools.product(COLLECTIVE_BACKEND, GROUPS)))
def test_a_reduction_never_hands_a_tensor_to_a_backend_that_cannot_take_it(device: str, group: str) -> None:
    served = group_backends(group)
    if device not in served and "cpu" not in served:
        with pytest.raises(ValueError, match="serves neither"):
            reduction(device, group)
        return
    where, dtype = reduction(device, group)
    assert where in served  # an accelerator-only group never gets a CPU tensor
    assert dtype in REDUCE_DTYPES[served[where]]  # no float64 on HCCL
    if device in served:
        assert where == device  # device tensors stay on the device when the group has its backend


def test_the_hccl_case_that_failed_seed_002s_first_step() -> None:
    assert reduction("npu", "hccl") == ("npu", "float32")  # was: a CPU float64 tensor on an HCCL group
    assert reduction("npu", "cpu:gloo,npu:hccl") == ("npu", "float32")
    assert reduction("cuda", "nccl") == ("cuda", "float64")
    assert reduction("cpu", "gloo") == ("cpu", "float64")


def test_fsdp_reduce_builds_its_tensor_where_the_group_backend_takes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A recording process-group layer: the FSDP2 backend's `_reduce` on an NPU rank of an HCCL group."""
    from engine.trainer.fsdp import FSDPTrainerBackend

    made, reduced = [], []
    real_tensor = torch.tensor

    def fake_tensor(data, dtype=None, device=None):
        made.append((getattr(device, "type", device), dtype))
        return real_tensor(data, dtype=dtype)

    monkeypatch.setattr(process_groups, "group_backend", lambda group=None: "npu:hccl")
    monkeypatch.setattr(process_groups.torch, "tensor", fake_tensor)
    monkeypatch.setattr(process_groups.dist, "all_reduce", lambda t, op=None, group=None: reduced.append(t.dtype))
    rank = SimpleNamespace(device=SimpleNamespace(type="npu"))
    assert FSDPTrainerBackend._reduce(rank, [1.0, 2.0], dist.ReduceOp.SUM) == [1.0, 2.0]
    assert made == [("npu", torch.float32)] and reduced == [torch.float32]
    monkeypatch.setattr(process_groups, "group_backend", lambda group=None: "cuda:nccl")
    with pytest.raises(ValueError, match="serves neither"):  # a CPU rank on an NCCL-only group: refused, not sent
        FSDPTrainerBackend._reduce(SimpleNamespace(device=torch.device("cpu")), [1.0], dist.ReduceOp.SUM)


@pytest.mark.parametrize(("role", "rank", "visible", "want"), [
    (RoleDevice("cuda", "ray"), 3, 1, "cuda:0"), (RoleDevice("npu", "local_rank"), 5, 4, "npu:1"),
    (RoleDevice("cpu", "none"), 2, 0, "cpu")])
def test_index_policy(role: RoleDevice, rank: int, visible: int, want: str) -> None:
    assert role.torch_device(rank, visible) == want


def test_init_process_group_passes_the_device_spec_and_the_documented_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict] = []
    monkeypatch.setattr(process_groups, "set_device", lambda role, rank: calls.append({"set_device": role.type}))
    monkeypatch.setattr(process_groups.dist, "init_process_group", lambda backend, **kw: calls.append(
        {"backend": backend, "timeout_s": kw["timeout"].total_seconds()}))
    process_groups.init_process_group(1, 2, "tcp://h:1", RoleDevice("npu", "ray"))
    assert calls == [{"set_device": "npu"}, {"backend": "cpu:gloo,npu:hccl", "timeout_s": 300.0}]
