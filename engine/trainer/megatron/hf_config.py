"""What Megatron needs to know about an HF decoder-only checkpoint, read from its `config.json` (pure Python).

Supported families (`model_type`): `qwen2` (qkv bias), `qwen3` (per-head q/k RMSNorm), `qwen3_moe` (routed
experts, softmax router with top-k), `llama` (optionally `attention_bias` / `mlp_bias` on every linear).
All share: pre-norm RMSNorm blocks, SwiGLU MLP `down(silu(gate(x)) ⊙ up(x))`, RoPE in the rotate-half
layout with `inv_freq_i = θ^(−2i/d)`, grouped-query attention. Anything else (sliding windows, RoPE
scaling, other activations) raises `UnsupportedModelError` rather than silently building a different model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SUPPORTED_MODEL_TYPES = ("qwen2", "qwen3", "qwen3_moe", "llama")


class UnsupportedModelError(ValueError):
    """The HF config describes something this backend would not reproduce exactly."""


@dataclass(frozen=True)
class ArchSpec:
    """The architecture facts of one HF checkpoint, in the units Megatron's `TransformerConfig` uses."""

    model_type: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    head_dim: int
    ffn_hidden_size: int
    vocab_size: int
    norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool = False
    linear_bias: bool = False  # bias on o_proj and on every MLP projection (Llama attention_bias+mlp_bias)
    qk_norm: bool = False
    num_experts: int = 0
    moe_top_k: int = 0
    moe_ffn_hidden_size: int = 0
    moe_norm_topk_prob: bool = True
    moe_layers: tuple[bool, ...] = field(default_factory=tuple)  # per layer: routed experts (True) or dense
    attention_dropout: float = 0.0  # config.json's attention_dropout (0 for Qwen and Llama releases)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0 and any(self.moe_layers)

    def layer_is_moe(self, layer: int) -> bool:
        return bool(self.moe_layers) and self.moe_layers[layer]


def _rope_theta(cfg: dict[str, Any]) -> float:
    """θ of RoPE from `rope_parameters` (transformers ≥ 5) or `rope_theta`; only unscaled RoPE is accepted."""
    params = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or {}
    rope_type = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    if rope_type != "default":
        raise UnsupportedModelError(f"RoPE scaling {rope_type!r} is not supported by the Megatron backend")
    theta = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
    return float(theta)


def _moe_layers(cfg: dict[str, Any], num_layers: int, num_experts: int) -> tuple[bool, ...]:
    """HF Qwen3-MoE rule: layer i is sparse iff i ∉ mlp_only_layers and (i + 1) % decoder_sparse_step == 0."""
    if num_experts <= 0:
        return tuple(False for _ in range(num_layers))
    step = int(cfg.get("decoder_sparse_step", 1) or 1)
    dense_only = set(cfg.get("mlp_only_layers") or [])
    return tuple(i not in dense_only and (i + 1) % step == 0 for i in range(num_layers))


def arch_from_hf_config(cfg: dict[str, Any]) -> ArchSpec:
    """Validate an HF config dict and translate it into an `ArchSpec`."""
    model_type = cfg.get("model_type", "")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise UnsupportedModelError(
            f"model_type {model_type!r} is not supported by the Megatron backend "
            f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
        )
    if cfg.get("hidden_act", "silu") != "silu":
        raise UnsupportedModelError(f"hidden_act {cfg.get('hidden_act')!r}: only SwiGLU (silu) is supported")
    if cfg.get("use_sliding_window"):
        raise UnsupportedModelError("sliding-window attention is not supported by the Megatron backend")
    hidden = int(cfg["hidden_size"])
    heads = int(cfg["num_attention_heads"])
    groups = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    layers = int(cfg["num_hidden_layers"])
    if heads % groups:
        raise UnsupportedModelError(f"num_attention_heads {heads} is not a multiple of num_key_value_heads {groups}")
    attention_bias = bool(cfg.get("attention_bias", False))
    mlp_bias = bool(cfg.get("mlp_bias", False))
    if model_type == "llama" and attention_bias != mlp_bias:
        raise UnsupportedModelError("llama with attention_bias != mlp_bias cannot be expressed in Megatron")
    if model_type in ("qwen3", "qwen3_moe") and attention_bias:
        raise UnsupportedModelError(f"{model_type} with attention_bias (o_proj bias without MLP bias) is not supported")
    num_experts = 0
    if model_type == "qwen3_moe":
        num_experts = int(cfg.get("num_experts") or cfg.get("num_local_experts") or 0)
        if num_experts <= 0:
            raise UnsupportedModelError("qwen3_moe config without num_experts")
        if int(cfg.get("shared_expert_intermediate_size") or 0):
            raise UnsupportedModelError("shared experts are not supported")
    moe_layers = _moe_layers(cfg, layers, num_experts)
    return ArchSpec(
        model_type=model_type,
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_query_groups=groups,
        head_dim=head_dim,
        ffn_hidden_size=int(cfg["intermediate_size"]),
        vocab_size=int(cfg["vocab_size"]),
        norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=_rope_theta(cfg),
        max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=model_type == "qwen2" or (model_type == "llama" and attention_bias),
        linear_bias=model_type == "llama" and attention_bias,
        qk_norm=model_type in ("qwen3", "qwen3_moe"),
        num_experts=num_experts,
        moe_top_k=int(cfg.get("num_experts_per_tok", 0)) if num_experts else 0,
        moe_ffn_hidden_size=int(cfg.get("moe_intermediate_size", 0)) if num_experts else 0,
        moe_norm_topk_prob=bool(cfg.get("norm_topk_prob", True)),
        moe_layers=moe_layers,
        attention_dropout=float(cfg.get("attention_dropout") or 0.0),
    )


def load_arch(hf_model_dir: str | Path) -> ArchSpec:
    """`arch_from_hf_config` of `<hf_model_dir>/config.json`."""
    with open(Path(hf_model_dir) / "config.json") as f:
        return arch_from_hf_config(json.load(f))
