"""The preallocated KV cache: growth past capacity, row selection, and the fallback for sliding windows."""

from __future__ import annotations

import torch

from engine.rollout.base import SamplingParams
from engine.rollout.hf.backend import HFRolloutBackend
from engine.rollout.hf.kv_cache import FallbackCache, GrowableKVCache, PreallocatedLayer, make_cache
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


def _cache(rows: int, cols: int, seed: int) -> tuple[GrowableKVCache, torch.Tensor]:
    cache = GrowableKVCache(capacity=cols + 4)
    kv = torch.randn(rows, 1, cols, 4, generator=torch.Generator().manual_seed(seed))
    for _ in range(2):  # two layers
        cache.update(kv, -kv, len(cache.layers))
    return cache, kv


def test_rows_join_and_leave_in_place_for_continuous_batching() -> None:
    from engine.rollout.hf.kv_cache import merge_rows

    running, a = _cache(3, 5, seed=0)
    joining, b = _cache(2, 3, seed=1)
    merged = merge_rows([(running, None), (joining, None)], width=5, capacity=9, row_capacity=6)
    assert merged.rows == 5 and merged.row_capacity == 6
    keys = merged.layers[1].keys
    assert torch.equal(keys[:3], a) and torch.equal(keys[3:, :, 2:], b)
    assert bool((keys[3:, :, :2] == 0).all())  # the new rows' left padding is zeros, never stale memory
    assert torch.equal(merged.layers[0].values[3:, :, 2:], -b)
    # row 1 leaves: the last row takes its slot, one row's copy
    merged.move_rows(torch.tensor([4]), torch.tensor([1]), rows=4)
    assert merged.rows == 4 and torch.equal(merged.layers[0].keys[1, :, 2:], b[1])
    # one more row joins into the free slots, right-aligned
    extra, c = _cache(2, 4, seed=2)
    assert merged.can_append(extra)
    merged.append_rows(extra)
    assert merged.rows == 6 and not merged.can_append(extra)  # no free slot left
    assert torch.equal(merged.layers[1].keys[4:, :, 1:], c) and bool((merged.layers[1].keys[4:, :, 0] == 0).all())
    keys, _ = merged.layers[0].update(torch.ones(6, 1, 1, 4), torch.ones(6, 1, 1, 4))
    assert keys.shape == (6, 1, 6, 4) and bool((keys[:, :, 5] == 1).all())
