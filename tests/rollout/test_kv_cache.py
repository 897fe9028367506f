"""The preallocated KV cache: growth past capacity, row selection, and the fallback for sliding windows."""

from __future__ import annotations

import torch

from engine.rollout.base import SamplingParams
from engine.rollout.hf import HFRolloutBackend
from engine.rollout.kv_cache import FallbackCache, GrowableKVCache, PreallocatedLayer, make_cache
from engine.types import GenRequest


def test_layer_grows_past_capacity_and_selects_rows() -> None:
    layer = PreallocatedLayer(capacity=2)
    chunks = [torch.randn(3, 1, n, 4) for n in (2, 1, 3)]
    for c in chunks:
        keys, values = layer.update(c, -c)
    expected = torch.cat(chunks, dim=2)
    assert layer.get_seq_length() == 6 and layer.capacity >= 6
    assert torch.equal(keys, expected) and torch.equal(values, -expected)
    layer.batch_select_indices(torch.tensor([2, 0, 0]))
    assert torch.equal(layer.keys, expected[[2, 0, 0]])
    keys, _ = layer.update(torch.ones(3, 1, 1, 4), torch.ones(3, 1, 1, 4))
    assert torch.equal(keys[:, :, :6], expected[[2, 0, 0]]) and bool((keys[:, :, 6] == 1).all())


def test_make_cache_picks_preallocated_only_for_full_attention() -> None:
    from transformers import Qwen2Config

    full = Qwen2Config(num_hidden_layers=2, hidden_size=64, num_attention_heads=2, num_key_value_heads=1)
    sliding = Qwen2Config(num_hidden_layers=2, hidden_size=64, num_attention_heads=2, num_key_value_heads=1,
                          use_sliding_window=True, sliding_window=4, max_window_layers=1)
    assert isinstance(make_cache(full, 8), GrowableKVCache)
    assert isinstance(make_cache(sliding, 8), FallbackCache)


def test_sliding_window_model_decodes_like_transformers_generate() -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=32, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=64, initializer_range=0.1,
                         use_sliding_window=True, sliding_window=4, max_window_layers=1, tie_word_embeddings=True)
    model = Qwen2ForCausalLM(config).eval()
    backend = HFRolloutBackend(model, eos_token_id=1, pad_token_id=0)
    prompts = [[5, 6, 7, 8, 9, 10], [3, 4], [11, 12, 13]]
    results = backend.generate([GenRequest(str(i), p, max_new_tokens=10) for i, p in enumerate(prompts)],
                               SamplingParams(temperature=0.0))
    for p, r in zip(prompts, results):
        with torch.no_grad():
            ref = model.generate(torch.tensor([p]), max_new_tokens=10, do_sample=False, eos_token_id=1,
                                 pad_token_id=0)[0, len(p):].tolist()
        assert r.response_ids == (ref[: ref.index(1) + 1] if 1 in ref else ref)
