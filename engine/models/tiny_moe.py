"""The tiny Qwen3-MoE model, built in-process: the shrunk seed 000 (`presets/runs/seed000-mini-cpu.toml`).

Same tokenizer as `builtin:tiny-qwen` (copy/reverse, 27 tokens, `engine.models.tiny`). Model: a random
`Qwen3MoeForCausalLM` — hidden 128, 2 decoder layers, 4 query heads and 2 KV heads of head_dim 32 (so
Megatron TP 2 splits both), q/k RMSNorm, 4 routed experts of width 128 per layer with top-2 routing and
normalised top-k probabilities (`norm_topk_prob`, as Qwen3-30B-A3B), untied embeddings; fp32, drawn from
`torch.manual_seed(seed)`.
"""

from __future__ import annotations

from pathlib import Path

from engine.models.tiny import DEFAULT_TASKS, MAX_POSITIONS, build_tiny_tokenizer, save_model_dir, seeded_model

TINY_MOE_FORMAT_VERSION = 2  # 2: files both transformers 4.5x and 5.x read (engine.models.portable)
EXPERTS, TOP_K = 4, 2


def build_tiny_moe_model_dir(out_dir: str | Path, seed: int = 0, layers: int = 2) -> Path:
    """Tokenizer + random Qwen3-MoE saved as an HF directory under `out_dir`; returns the path."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tiny_tokenizer(DEFAULT_TASKS)
    config = Qwen3MoeConfig(
        vocab_size=len(tok), hidden_size=128, intermediate_size=256, moe_intermediate_size=128,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        num_experts=EXPERTS, num_experts_per_tok=TOP_K, norm_topk_prob=True, decoder_sparse_step=1,
        mlp_only_layers=[], max_position_embeddings=MAX_POSITIONS, tie_word_embeddings=False,
        bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        initializer_range=0.02, router_aux_loss_coef=0.0, output_router_logits=False,
    )
    config.architectures = ["Qwen3MoeForCausalLM"]
    model = seeded_model(Qwen3MoeForCausalLM, config, seed)
    meta = {"builder": "asyncrl tiny-qwen3-moe", "format_version": TINY_MOE_FORMAT_VERSION, "seed": seed,
            "layers": layers}
    return save_model_dir(model, tok, out, meta)
