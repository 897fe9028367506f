"""Build a Megatron-core `GPTModel` that computes exactly what the HF checkpoint computes.

Mapping (HF → Megatron `TransformerConfig`): hidden/heads/`num_key_value_heads` (GQA → `num_query_groups`)/
`head_dim` (→ `kv_channels`)/`intermediate_size`; RMSNorm with `rms_norm_eps`; SwiGLU
(`gated_linear_unit`, silu): `fc2(silu(x W_gateᵀ) ⊙ x W_upᵀ)`; RoPE, rotate-half layout, base θ =
`rope_theta`; qkv bias (Qwen2), q/k RMSNorm per head (Qwen3), tied or untied output embedding; routed
experts (Qwen3-MoE): router logits r = x W_routerᵀ in fp32, p = softmax(r); top-k experts, weights
renormalised over the top-k when `norm_topk_prob` (Megatron: top-k of r, then softmax over the k), else
the raw softmax probabilities (Megatron `moe_router_pre_softmax`). By default no dropout and no router auxiliary
loss; `trainer.*` model settings (`engine.config.megatron_model`: uneven pipeline stages, the load-balancing and
z-losses, attention / hidden dropout) set Megatron's fields of the same names (`moe_aux.py` scales and logs the
auxiliary losses).

Megatron's *local* layer spec is used (no Transformer Engine; with CP > 1 or `trainer.use_flash_attn`, on CUDA,
only its core attention is Transformer Engine's — with Megatron's flash backend for the latter —, see
`context_parallel.py`), with one change: its norms are
`SPRMSNorm`, a `torch.nn.RMSNorm` that accepts Megatron's constructor and marks its weight for
sequence parallelism, which Megatron requires for MoE with TP > 1 and which `WrappedTorchNorm` refuses.

Vocabulary: the embedding and output layer are vocab-parallel and need a vocab divisible by TP; the vocab
is padded to the next multiple of TP with zero rows (`padded_vocab_size`), and the log-prob code masks
the padding logits out of the softmax.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

from engine.trainer.megatron.hf_config import ArchSpec
from engine.trainer.megatron.parallel import ParallelLayout
from engine.trainer.megatron.shims import tensor_cuda_is_identity


class SPRMSNorm(torch.nn.RMSNorm):
    """y = x / sqrt(mean(x²) + ε) · w, built the way Megatron builds norms; weight tagged `sequence_parallel`."""

    def __init__(self, config: object, hidden_size: int, eps: float = 1e-5, **_: object) -> None:
        super().__init__(hidden_size, eps=eps, dtype=getattr(config, "params_dtype", None))
        self.weight.sequence_parallel = bool(getattr(config, "sequence_parallel", False))


def padded_vocab_size(vocab_size: int, tp: int) -> int:
    """Smallest multiple of `tp` that is ≥ `vocab_size`."""
    return int(math.ceil(vocab_size / tp) * tp)


def recompute_settings(granularity: str | None, method: str = "uniform", num_layers: int = 1) -> dict[str, object]:
    """Megatron's activation-recompute fields: `full` = whole layers (`method`, `num_layers`), `selective` =
    core attention only (Megatron wants no method / layer count then), None = off."""
    if granularity is None:
        return {}
    if granularity == "selective":
        return {"recompute_granularity": "selective"}
    return {"recompute_granularity": "full", "recompute_method": method, "recompute_num_layers": num_layers}


def transformer_config(arch: ArchSpec, layout: ParallelLayout, dtype: torch.dtype, on_gpu: bool,
                       recompute: dict[str, object] | None = None, dispatcher: str | None = None,
                       settings: Mapping[str, Any] | None = None, flash: bool = False):
    """The Megatron `TransformerConfig` for `arch` under `layout` (fp32 or bf16 params; `recompute` from
    `recompute_settings`; `dispatcher`: the MoE token dispatcher, `engine.plan.megatron_perf`'s resolution, None =
    all-to-all on GPU with ep > 1, else all-gather; `settings`: the `trainer.*` model settings of
    `engine.config.megatron_model` that are set; `flash`: Megatron's flash attention backend, CUDA only)."""
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.enums import AttnBackend

    s = dict(settings or {})

    moe: dict[str, object] = {}
    if arch.is_moe:
        moe = {
            "num_moe_experts": arch.num_experts,
            "moe_router_topk": arch.moe_top_k,
            "moe_ffn_hidden_size": arch.moe_ffn_hidden_size,
            "moe_layer_freq": [1 if m else 0 for m in arch.moe_layers],
            "moe_router_score_function": "softmax",
            "moe_router_pre_softmax": not arch.moe_norm_topk_prob,
            "moe_router_load_balancing_type": s.get("moe_router_load_balancing_type", "none"),
            "moe_aux_loss_coeff": float(s.get("moe_aux_loss_coeff", 0.0)),
            "moe_z_loss_coeff": s.get("moe_z_loss_coeff"),
            "moe_router_dtype": "fp32",
            # all-to-all needs CUDA streams; the all-gather dispatcher runs on gloo
            "moe_token_dispatcher_type": dispatcher or ("alltoall" if (on_gpu and layout.ep > 1) else "allgather"),
            "moe_grouped_gemm": False,
        }
    # each micro-batch's own [b, S] through the pipeline (pipeline.py); Megatron's all-gather MoE dispatcher
    # cannot take them (those pipelines pad every micro-batch to one shape), and Megatron checks the dispatcher
    # field of a dense model too
    variable = layout.pp > 1 and moe.get("moe_token_dispatcher_type", "alltoall") != "allgather"
    if variable and not moe:
        moe = {"moe_token_dispatcher_type": "alltoall"}  # no experts: the field only passes Megatron's check
    return TransformerConfig(
        num_layers=arch.num_layers,
        hidden_size=arch.hidden_size,
        num_attention_heads=arch.num_attention_heads,
        num_query_groups=arch.num_query_groups,
        kv_channels=arch.head_dim,
        ffn_hidden_size=arch.ffn_hidden_size,
        normalization="RMSNorm",
        layernorm_epsilon=arch.norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=arch.linear_bias,
        add_qkv_bias=arch.qkv_bias,
        qk_layernorm=arch.qk_norm,
        hidden_dropout=float(s.get("hidden_dropout") or 0.0),
        attention_dropout=float(s.get("attention_dropout") if s.get("attention_dropout") is not None
                                else arch.attention_dropout),
        num_layers_in_first_pipeline_stage=layout.first_stage_layers,
        num_layers_in_last_pipeline_stage=layout.last_stage_layers,
        attention_backend=AttnBackend.flash if flash else AttnBackend.auto,
        tensor_model_parallel_size=layout.tp,
        pipeline_model_parallel_size=layout.pp,
        context_parallel_size=layout.cp,
        expert_model_parallel_size=layout.ep,
        expert_tensor_parallel_size=layout.etp,
        sequence_parallel=layout.tp > 1,
        params_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        use_cpu_initialization=not on_gpu,
        perform_initialization=True,  # weights are then overwritten from HF, but only Megatron's init sets
        # the `tensor_model_parallel` attributes that grad-norm and the optimizer rely on
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        gradient_accumulation_fusion=False,
        apply_rope_fusion=False,
        attention_softmax_in_fp32=True,
        # pipeline p2p on gloo: plain isend/irecv (batched p2p synchronises CUDA), activations in `dtype`
        pipeline_dtype=dtype,
        batch_p2p_comm=on_gpu,
        batch_p2p_sync=on_gpu,
        variable_seq_lengths=variable,
        **moe,
        **(recompute or {}),
    )


def _use_sp_norms(module_spec: object) -> None:
    """Replace every norm of a local layer spec (input, pre-MLP, q/k) by `SPRMSNorm`, in place."""
    sub = getattr(module_spec, "submodules", None)
    if sub is None:
        return
    for name in ("input_layernorm", "pre_mlp_layernorm", "q_layernorm", "k_layernorm"):
        current = getattr(sub, name, None)
        if isinstance(current, type) and current.__name__ in ("WrappedTorchNorm", "FusedLayerNorm"):
            setattr(sub, name, SPRMSNorm)
    attn = getattr(sub, "self_attention", None)
    if attn is not None:
        _use_sp_norms(attn)


def layer_block_spec(config: object, te_attention: bool = False):
    """Megatron's local block spec (dense/MoE per `moe_layer_freq`) with `SPRMSNorm` norms; Transformer Engine's
    core attention with cp > 1 or `te_attention` (flash attention on CUDA)."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

    block = get_gpt_decoder_block_spec(config, use_transformer_engine=False, normalization="RMSNorm")
    for spec in {id(s): s for s in block.layer_specs}.values():
        _use_sp_norms(spec)
    block.layer_norm = SPRMSNorm
    if te_attention or getattr(config, "context_parallel_size", 1) > 1:  # CUDA + TE only (`context_parallel.py`)
        from engine.trainer.megatron.context_parallel import use_te_attention

        use_te_attention(block)
    return block


def build_gpt_model(arch: ArchSpec, layout: ParallelLayout, dtype: torch.dtype, on_gpu: bool,
                    recompute: dict[str, object] | None = None, dispatcher: str | None = None,
                    settings: Mapping[str, Any] | None = None, flash: bool = False):
    """An uninitialised `GPTModel` for `arch` on this rank (weights are filled by `convert`).

    Call after `init_model_parallel(layout)` and `seed_model_parallel_rng`. Logits stay vocab-parallel.
    With PP > 1 this rank builds its stage only: the embedding on the first stage, the final norm and
    output layer on the last (`convert.stage_rules` names the same tensors).
    """
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel

    flash = flash and on_gpu  # on CPU the local attention (the dry run says so)
    if flash:
        from engine.trainer.megatron.context_parallel import te_available
        from engine.trainer.megatron.parallel import ParallelConfigError

        if not te_available():
            raise ParallelConfigError("trainer.use_flash_attn needs Transformer Engine's attention on CUDA: install "
                                      "transformer-engine[pytorch], or set trainer.use_flash_attn = false")
    config = transformer_config(arch, layout, dtype, on_gpu, recompute, dispatcher, settings, flash)
    with tensor_cuda_is_identity():
        model = GPTModel(
            config=config,
            transformer_layer_spec=layer_block_spec(config, te_attention=flash),
            vocab_size=padded_vocab_size(arch.vocab_size, layout.tp),
            max_sequence_length=arch.max_position_embeddings,
            pre_process=ps.is_pipeline_first_stage(),
            post_process=ps.is_pipeline_last_stage(),
            parallel_output=True,
            share_embeddings_and_output_weights=arch.tie_word_embeddings,
            position_embedding_type="rope",
            rotary_percent=1.0,
            rotary_base=arch.rope_theta,
        )
    if on_gpu:
        model = model.cuda()
    return model
