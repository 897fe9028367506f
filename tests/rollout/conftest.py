"""Fixtures: a tiny random-init Qwen2 causal LM (no tokenizer needed: token ids are the vocabulary)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

PAD_ID, EOS_ID, VOCAB = 0, 1, 32


def build_tiny_lm(seed: int = 0, layers: int = 2) -> torch.nn.Module:
    """Qwen2 with hidden 128, 2 heads of dim 64, 1 KV head, tied embeddings, deterministic in `seed`."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=VOCAB, hidden_size=128, intermediate_size=512, num_hidden_layers=layers,
        num_attention_heads=2, num_key_value_heads=1, head_dim=64, max_position_embeddings=256,
        tie_word_embeddings=True, initializer_range=0.1, pad_token_id=PAD_ID, eos_token_id=EOS_ID,
        bos_token_id=EOS_ID,
    )
    return Qwen2ForCausalLM(config).eval()


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


@pytest.fixture
def tiny_lm() -> Callable[..., torch.nn.Module]:
    return build_tiny_lm
