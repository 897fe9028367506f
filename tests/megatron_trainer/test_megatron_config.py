"""HF config.json → Megatron architecture facts, and parallel-layout validation (no megatron import)."""

from __future__ import annotations

import pytest
from megatron_helpers import tiny_hf_model

from engine.trainer.megatron.hf_config import UnsupportedModelError, arch_from_hf_config
from engine.trainer.megatron.model import padded_vocab_size
from engine.trainer.megatron.parallel import ParallelConfigError, ParallelLayout


def _cfg(kind: str) -> dict:
    return tiny_hf_model(kind).config.to_dict()


def test_qwen2_has_qkv_bias_tied_embeddings_and_gqa() -> None:
    arch = arch_from_hf_config(_cfg("qwen2"))
    assert (arch.qkv_bias, arch.linear_bias, arch.qk_norm, arch.tie_word_embeddings) == (True, False, False, True)
    assert (arch.num_attention_heads, arch.num_query_groups, arch.head_dim) == (4, 2, 32)
    assert not arch.is_moe


def test_qwen3_has_qk_norm_and_explicit_head_dim() -> None:
    cfg = _cfg("qwen3")
    cfg["head_dim"] = 48  # Qwen3 head_dim need not be hidden / heads
    arch = arch_from_hf_config(cfg)
    assert arch.qk_norm and not arch.qkv_bias and arch.head_dim == 48


def test_qwen3_moe_layers_experts_and_router() -> None:
    arch = arch_from_hf_config(_cfg("qwen3_moe"))
    assert (arch.num_experts, arch.moe_top_k, arch.moe_ffn_hidden_size) == (4, 2, 48)
    assert arch.moe_layers == (True, False)  # mlp_only_layers = [1]
    assert arch.moe_norm_topk_prob


def test_moe_sparse_step_and_legacy_keys() -> None:
    cfg = _cfg("qwen3_moe")
    cfg.pop("num_local_experts", None)
    cfg.update(num_experts=8, decoder_sparse_step=2, mlp_only_layers=[], num_hidden_layers=4,
               rope_parameters=None, rope_theta=1e6)
    arch = arch_from_hf_config(cfg)
    assert arch.num_experts == 8 and arch.moe_layers == (False, True, False, True)
    assert arch.rope_theta == 1e6


def test_llama_biases_and_rope_theta() -> None:
    arch = arch_from_hf_config(_cfg("llama"))
    assert arch.qkv_bias and arch.linear_bias and arch.rope_theta == 5000.0


@pytest.mark.parametrize("change, message", [
    ({"model_type": "gpt2"}, "not supported"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}}, "RoPE scaling"),
    ({"use_sliding_window": True}, "sliding-window"),
    ({"hidden_act": "gelu"}, "silu"),
    ({"attention_bias": True}, "attention_bias"),
])
def test_configs_that_would_change_the_model_are_rejected(change: dict, message: str) -> None:
    cfg = _cfg("qwen3")
    cfg.update(change)
    with pytest.raises(UnsupportedModelError, match=message):
        arch_from_hf_config(cfg)


def test_vocab_is_padded_to_a_multiple_of_tp() -> None:
    assert padded_vocab_size(61, 1) == 61
    assert padded_vocab_size(61, 2) == 62
    assert padded_vocab_size(151936, 8) == 151936


@pytest.mark.parametrize("layout, message", [
    (ParallelLayout(pp=2, world_size=3), "not divisible"),
    (ParallelLayout(cp=2, world_size=2), "context parallelism"),
    (ParallelLayout(tp=2, world_size=3), "not divisible"),
    (ParallelLayout(ep=2, world_size=1), "must divide"),
])
def test_unavailable_layouts_fail_before_any_process_group(layout: ParallelLayout, message: str) -> None:
    with pytest.raises(ParallelConfigError, match=message):
        layout.validate(on_gpu=False, num_experts=4)


def test_model_shape_constraints_on_layout() -> None:
    ParallelLayout(pp=2, world_size=2).validate(on_gpu=False, num_layers=2)  # PP runs on CPU
    with pytest.raises(ParallelConfigError, match="num_layers 3 is not divisible by pp 2"):
        ParallelLayout(pp=2, world_size=2).validate(on_gpu=False, num_layers=3)
    with pytest.raises(ParallelConfigError, match="num_key_value_heads"):
        ParallelLayout(tp=4, world_size=4).validate(on_gpu=False, num_query_groups=2)
    with pytest.raises(ParallelConfigError, match="num_experts"):
        ParallelLayout(ep=4, world_size=4).validate(on_gpu=False, num_experts=6)
    with pytest.raises(ParallelConfigError, match="mixture-of-experts"):
        ParallelLayout(ep=2, world_size=2).validate(on_gpu=False, num_experts=0)
    ParallelLayout(tp=2, ep=2, world_size=4).validate(on_gpu=False, num_experts=4, num_query_groups=2)
