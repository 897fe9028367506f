"""The architecture fields of released models' `config.json` (facts typed from each public repository's
config.json on the Hugging Face hub, `<org>/<name>`), with the parameter totals their model cards publish.

Only the fields the parameter count reads are kept; values are as the repositories publish them.
"""

from __future__ import annotations

RELEASED: dict[str, tuple[dict, float, str]] = {
    # name: (config.json fields, published total parameters, where the total is published)
    "deepseek-ai/DeepSeek-V3": (
        {"model_type": "deepseek_v3", "vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432,
         "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 128,
         "num_key_value_heads": 128, "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8,
         "first_k_dense_replace": 3, "moe_layer_freq": 1, "q_lora_rank": 1536, "kv_lora_rank": 512,
         "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "num_nextn_predict_layers": 1,
         "tie_word_embeddings": False, "max_position_embeddings": 163840},
        671e9, "model card: 671B total parameters, 37B activated (MTP module excluded)"),
    "moonshotai/Kimi-K2-Instruct": (
        {"model_type": "kimi_k2", "vocab_size": 163840, "hidden_size": 7168, "intermediate_size": 18432,
         "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 64,
         "num_key_value_heads": 64, "n_routed_experts": 384, "n_shared_experts": 1, "num_experts_per_tok": 8,
         "first_k_dense_replace": 1, "moe_layer_freq": 1, "q_lora_rank": 1536, "kv_lora_rank": 512,
         "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "tie_word_embeddings": False,
         "max_position_embeddings": 131072},
        1.0e12, "model card: 1 trillion total parameters, 32B activated"),
    "openai/gpt-oss-20b": (
        {"model_type": "gpt_oss", "vocab_size": 201088, "hidden_size": 2880, "intermediate_size": 2880,
         "num_hidden_layers": 24, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
         "num_local_experts": 32, "num_experts_per_tok": 4, "experts_per_token": 4, "attention_bias": True,
         "tie_word_embeddings": False, "max_position_embeddings": 131072},
        20.9e9, "model card: 21B parameters (20.9B), 3.6B active"),
    "zai-org/GLM-4.5-Air": (
        {"model_type": "glm4_moe", "vocab_size": 151552, "hidden_size": 4096, "intermediate_size": 10944,
         "moe_intermediate_size": 1408, "num_hidden_layers": 46, "num_attention_heads": 96,
         "num_key_value_heads": 8, "head_dim": 128, "n_routed_experts": 128, "n_shared_experts": 1,
         "num_experts_per_tok": 8, "first_k_dense_replace": 1, "attention_bias": True, "use_qk_norm": False,
         "num_nextn_predict_layers": 1, "tie_word_embeddings": False, "max_position_embeddings": 131072},
        106e9, "model card: 106B total parameters, 12B active"),
    "allenai/OLMoE-1B-7B-0924": (
        {"model_type": "olmoe", "vocab_size": 50304, "hidden_size": 2048, "intermediate_size": 1024,
         "num_hidden_layers": 16, "num_attention_heads": 16, "num_key_value_heads": 16, "num_experts": 64,
         "num_experts_per_tok": 8, "tie_word_embeddings": False, "max_position_embeddings": 4096},
        6.9e9, "model card: 6.9B total parameters, 1.3B active"),
    "google/gemma-2-9b": (  # config.json has no tie_word_embeddings: Gemma2Config defaults it to True
        {"model_type": "gemma2", "vocab_size": 256000, "hidden_size": 3584, "intermediate_size": 14336,
         "num_hidden_layers": 42, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256,
         "max_position_embeddings": 8192},
        9.24e9, "Hugging Face model page: 9.24B params"),
    "mistralai/Mixtral-8x7B-v0.1": (
        {"model_type": "mixtral", "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336,
         "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "num_local_experts": 8,
         "num_experts_per_tok": 2, "tie_word_embeddings": False, "max_position_embeddings": 32768},
        46.7e9, "Mistral AI announcement: 46.7B total parameters, 12.9B per token"),
    "mistralai/Mixtral-8x22B-v0.1": (
        {"model_type": "mixtral", "vocab_size": 32768, "hidden_size": 6144, "intermediate_size": 16384,
         "num_hidden_layers": 56, "num_attention_heads": 48, "num_key_value_heads": 8, "num_local_experts": 8,
         "num_experts_per_tok": 2, "tie_word_embeddings": False, "max_position_embeddings": 65536},
        141e9, "Mistral AI announcement: 141B total parameters, 39B active"),
    "Qwen/Qwen3-235B-A22B": (
        {"model_type": "qwen3_moe", "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 12288,
         "moe_intermediate_size": 1536, "num_hidden_layers": 94, "num_attention_heads": 64,
         "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8,
         "decoder_sparse_step": 1, "mlp_only_layers": [], "tie_word_embeddings": False,
         "max_position_embeddings": 40960},
        235e9, "model card: 235B total parameters, 22B activated"),
    "Qwen/Qwen3-Coder-480B-A35B-Instruct": (
        {"model_type": "qwen3_moe", "vocab_size": 151936, "hidden_size": 6144, "intermediate_size": 8192,
         "moe_intermediate_size": 2560, "num_hidden_layers": 62, "num_attention_heads": 96,
         "num_key_value_heads": 8, "head_dim": 128, "num_experts": 160, "num_experts_per_tok": 8,
         "decoder_sparse_step": 1, "mlp_only_layers": [], "tie_word_embeddings": False,
         "max_position_embeddings": 262144},
        480e9, "model card: 480B total parameters, 35B activated"),
    "Qwen/Qwen2.5-VL-7B-Instruct": (  # text fields at the top level, as the released config.json has them
        {"model_type": "qwen2_5_vl", "vocab_size": 152064, "hidden_size": 3584, "intermediate_size": 18944,
         "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
         "tie_word_embeddings": False, "max_position_embeddings": 128000,
         "vision_config": {"depth": 32, "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16,
                           "in_chans": 3, "out_hidden_size": 3584, "patch_size": 14, "spatial_merge_size": 2,
                           "temporal_patch_size": 2}},
        8.29e9, "Hugging Face model page: 8.29B params"),
    "deepseek-ai/DeepSeek-V2-Lite": (
        {"model_type": "deepseek_v2", "vocab_size": 102400, "hidden_size": 2048, "intermediate_size": 10944,
         "moe_intermediate_size": 1408, "num_hidden_layers": 27, "num_attention_heads": 16,
         "num_key_value_heads": 16, "n_routed_experts": 64, "n_shared_experts": 2, "num_experts_per_tok": 6,
         "first_k_dense_replace": 1, "moe_layer_freq": 1, "q_lora_rank": None, "kv_lora_rank": 512,
         "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "tie_word_embeddings": False,
         "max_position_embeddings": 163840},
        15.7e9, "model card: 15.7B total parameters, 2.4B activated"),
}
