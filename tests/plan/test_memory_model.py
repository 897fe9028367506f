"""The memory model (`engine.plan.memory`): each named term answers to the config key it models, `fit.py` is a
view of it, and the shipped production presets fit their hardware with their response lengths."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncrl_cli.config.fit import estimate_fit
from asyncrl_cli.config.loader import analyze_run_config
from engine.plan.memory import CALIBRATION, GB, calibration, predict_memory

RUNS = Path(__file__).resolve().parents[2] / "presets" / "runs"
SEVEN_B = RUNS / "qwen2.5-math-7b-dapo-fsdp2-64-64.toml"
MOE = RUNS / "qwen3-30b-a3b-base-dapo-megatron-96-32.toml"
PRODUCTION = ["qwen2.5-math-7b-dapo-fsdp2-64-64", "qwen3-30b-a3b-base-dapo-megatron-96-32",
              "qwen3-30b-a3b-base-dapo-megatron-96-32-mis", "qwen3-30b-a3b-base-dapo-megatron-96-32-is",
              "qwen3-vl-8b-geo3k-fsdp2-npu-16-16",
              "qwen3-vl-8b-geo3k-fsdp2-npu-2x8"]


def _predict(path: Path, *overrides: str):
    an = analyze_run_config(path, list(overrides))
    assert an.config is not None and an.model is not None and an.hardware is not None
    return predict_memory(an.config, an.model, trainer_world=an.derived.trainer_world,
                          memory_gb=an.hardware.memory_gb, device=an.hardware.device), an


def test_the_shipped_calibration_is_a_measured_table() -> None:
    cal = calibration()
    assert CALIBRATION.exists() and set(cal["coefficients"]) == {"c_h", "c_i", "c_m", "c_ck", "c_t", "c_v", "c_tail", "c_bwd"}
    assert all(v > 0 for v in cal["coefficients"].values())


@pytest.mark.parametrize("name", PRODUCTION)
def test_production_presets_fit_their_hardware(name: str) -> None:
    p, an = _predict(RUNS / f"{name}.toml")
    assert p.trainer.fits and p.rollout.fits, (p.trainer.terms, p.rollout.terms)
    assert an.config.trainer.use_dynamic_bsz  # token budgets, as the verl scripts they come from
    assert estimate_fit(an.config, an.model, an.hardware).trainer.total_gb == pytest.approx(p.trainer.total / GB)


def test_token_budget_recompute_and_chunking_each_bound_their_term() -> None:
    fixed, _ = _predict(SEVEN_B, "trainer.use_dynamic_bsz=false", "trainer.enable_gradient_checkpointing=false")
    budget, _ = _predict(SEVEN_B, "trainer.ppo_max_token_len_per_gpu=30720",
                         "trainer.log_prob_max_token_len_per_gpu=30720", "trainer.enable_gradient_checkpointing=false")
    assert budget.trainer.terms["activations"] == pytest.approx(fixed.trainer.terms["activations"])  # 1 × 30720
    half, _ = _predict(SEVEN_B, "trainer.ppo_max_token_len_per_gpu=30720",
                       "trainer.log_prob_max_token_len_per_gpu=30720")
    assert half.trainer.terms["activations"] < budget.trainer.terms["activations"] / 3  # recompute
    small_chunk, _ = _predict(SEVEN_B, "trainer.logprob_chunk_tokens=1024")
    full, _ = _predict(SEVEN_B)
    head = "head_forward_bytes"  # the chunk's forward with the entropy metric: its peak moment
    assert small_chunk.trainer.details[head] == pytest.approx(full.trainer.details[head] / 4)


def test_fsdp2_terms_follow_the_code_per_precision() -> None:
    """Issue 43: FSDP2's MixedPrecisionPolicy casts the parameters, so each checkpointed layer keeps its input in
    bf16 (h·2 bytes per token), the gradients stay sharded (every micro-batch reduce-scatters), the root unit
    gathers the embeddings and the untied output head, and a VL model's head keeps one more fp32 copy."""
    vl, an = _predict(RUNS / "qwen3-vl-8b-geo3k-fsdp2-npu-16-16.toml")
    m, t = an.model, vl.trainer
    tokens = an.config.trainer.ppo_max_token_len_per_gpu
    assert t.details["residual_bytes"] == 2
    assert t.terms["activations"] == pytest.approx(tokens * m.layers * m.hidden * 2)
    assert t.terms["gradients"] == pytest.approx(m.params_total * 4 / 16)
    assert not m.tied and t.terms["compute_copy"] > 2 * m.vocab * m.hidden * 2
    # the head's forward at 4096 tokens: logits b_c + 16 (fp32 logits, log-softmax, entropy exp and product) + 4
    assert t.details["head_forward_bytes"] == pytest.approx(4096 * m.vocab * (2 + 16 + 4))
    text, _ = _predict(SEVEN_B)
    assert text.trainer.details["head_forward_bytes"] == pytest.approx(4096 * 152064 * (2 + 16))


def test_precision_reference_and_rollout_dtype_terms() -> None:
    p, an = _predict(MOE, "trainer.ref_param_offload=false")
    assert "reference" in p.trainer.terms  # use_kl_loss: the frozen reference's shard in bf16
    assert p.trainer.terms["reference"] == pytest.approx(p.trainer.terms["weights"])
    off, _ = _predict(MOE, "trainer.ref_param_offload=true")
    assert "reference" not in off.trainer.terms and off.trainer.host["reference"] > 0
    etp, _ = _predict(MOE, "trainer.ref_param_offload=false", "trainer.etp=2")
    assert etp.trainer.terms["weights"] < p.trainer.terms["weights"]  # experts split ep × etp ways
    fp32_rollout, _ = _predict(SEVEN_B, 'rollout.dtype="fp32"')
    bf16_rollout, _ = _predict(SEVEN_B)
    assert fp32_rollout.rollout.terms["weights"] == pytest.approx(2 * bf16_rollout.rollout.terms["weights"])
    pure, _ = _predict(SEVEN_B, "trainer.fp32_master_weights=false")
    assert pure.trainer.terms["optimizer"] == pytest.approx(bf16_rollout.trainer.terms["optimizer"] / 2)


def test_host_terms_count_on_cpu_hardware() -> None:
    gpu, _ = _predict(SEVEN_B)
    assert set(gpu.trainer.host) == {"prox_snapshot", "weight_sync_bucket"}  # decoupled: π_prox on the host
    cpu, _ = _predict(SEVEN_B, "resources.hardware=cpu")
    assert cpu.trainer.host == {} and {"prox_snapshot", "weight_sync_bucket"} <= set(cpu.trainer.terms)


def test_the_seed_000_is_preset_computes_the_megatron_proximal_log_prob() -> None:
    """Seed 000 as verl PR #4023 runs it: decoupled (three policies, π_prox from the trainer), token IS at 2.0."""
    from engine.algo.loss import build_loss_fn

    p, an = _predict(RUNS / "qwen3-30b-a3b-base-dapo-megatron-96-32-is.toml")
    rc = an.config.algorithm.rollout_correction
    assert (rc.bypass_mode, rc.rollout_is, rc.rollout_is_threshold) == (False, "token", 2.0)
    assert an.config.trainer.backend == "megatron" and an.config.trainer.cp == 2
    assert build_loss_fn(an.config.trainer, rc).bypass_mode is False  # the loss uses π_prox, not the rollout's log-probs
    base, _ = _predict(MOE)
    assert "prox_snapshot" in p.trainer.host and "prox_snapshot" not in base.trainer.host
    assert p.trainer.host["prox_snapshot"] == pytest.approx(2 * p.trainer.terms["weights"])  # fp32 snapshot of bf16


def test_ulysses_splits_the_group_micro_batch_over_its_ranks() -> None:
    """SP s: token budgets are per GPU (the group's micro-batch holds s × the budget, verl's count), so a rank's
    activations stay those of one budget; fixed micro-batches of rows are split s ways; DP = ranks / s."""
    sp = "trainer.ulysses_sequence_parallel_size"
    one, an = _predict(SEVEN_B, "trainer.enable_gradient_checkpointing=false")
    four, _ = _predict(SEVEN_B, f"{sp}=4", "trainer.enable_gradient_checkpointing=false")
    t = an.config.trainer
    assert four.trainer.details["tokens_per_rank"] == one.trainer.details["tokens_per_rank"] == t.ppo_max_token_len_per_gpu
    assert four.trainer.details["tokens_per_micro_batch"] == 4 * t.ppo_max_token_len_per_gpu
    assert four.trainer.details["data_parallel"] == one.trainer.details["data_parallel"] // 4
    assert four.trainer.terms["activations"] == pytest.approx(one.trainer.terms["activations"])
    assert set(four.trainer.terms) == set(one.trainer.terms)  # no term of its own: no padding mask is built
    rows_one, _ = _predict(SEVEN_B, "trainer.use_dynamic_bsz=false", "trainer.enable_gradient_checkpointing=false")
    rows_four, _ = _predict(SEVEN_B, "trainer.use_dynamic_bsz=false", "trainer.enable_gradient_checkpointing=false",
                            f"{sp}=4")
    assert rows_four.trainer.terms["activations"] == pytest.approx(rows_one.trainer.terms["activations"] / 4)


def test_megatron_optimizer_shards_dense_over_dp_times_cp_and_counts_the_reference_pass() -> None:
    """Issue 43's Megatron rehearsal: the distributed optimizer shards dense parameters over DP × CP (halving the
    dense state at cp = 2), and an offloaded reference (`ref_param_offload`) comes onto the device for its
    log-prob pass, a moment larger than the update's on the seed-000 preset."""
    base, _ = _predict(MOE)
    no_cp, _ = _predict(MOE, "trainer.cp=1")  # same world: dp doubles, the dense shard is the same size
    assert base.trainer.terms["optimizer"] == pytest.approx(no_cp.trainer.terms["optimizer"], rel=1e-6)
    assert 11.3 * GB < base.trainer.terms["optimizer"] < 11.6 * GB
    details = base.trainer.details
    assert details["reference_pass_gb"] > details["update_moment_gb"]
    assert base.trainer.terms["reference_pass"] == pytest.approx(
        (details["reference_pass_gb"] - details["update_moment_gb"]) * GB, abs=0.02 * GB)
    resident, _ = _predict(MOE, "trainer.ref_param_offload=false")
    assert "reference_pass" not in resident.trainer.terms and resident.trainer.terms["reference"] > 8 * GB
