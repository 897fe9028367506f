"""Bucketing of named arrays and the receiving copy into a model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.sync.apply import load_buckets_into
from engine.sync.buckets import bucket_nbytes, bucketize


def arrays(sizes: list[int]) -> list[tuple[str, np.ndarray]]:
    return [(f"w{i}", np.full(n, i, dtype=np.float32)) for i, n in enumerate(sizes)]


def test_buckets_respect_the_bound_keep_order_and_lose_nothing() -> None:
    named = arrays([10, 20, 5, 100, 1, 1, 30])
    buckets = list(bucketize(named, bucket_bytes=120))
    # float32 sizes in bytes: 40, 80, 20, 400, 4, 4, 120
    assert [list(b) for b in buckets] == [["w0", "w1"], ["w2"], ["w3"], ["w4", "w5"], ["w6"]]
    for b in buckets:
        assert bucket_nbytes(b) <= 120 or len(b) == 1
    flat = [(n, a) for b in buckets for n, a in b.items()]
    assert [n for n, _ in flat] == [n for n, _ in named]
    assert all(a is b for (_, a), (_, b) in zip(flat, named))


def test_oversized_array_travels_alone_and_zero_means_one_bucket() -> None:
    assert [list(b) for b in bucketize(arrays([1, 1000, 1]), 16)] == [["w0"], ["w1"], ["w2"]]
    assert len(list(bucketize(arrays([1, 1000, 1]), 0))) == 1
    with pytest.raises(ValueError):
        list(bucketize([("a", np.zeros(1)), ("a", np.zeros(1))], 100))


def test_load_buckets_into_copies_read_only_arrays_and_tied_weights(tiny_lm) -> None:
    src, dst = tiny_lm(seed=1), tiny_lm(seed=2)
    named = []
    for name, t in src.state_dict().items():
        a = t.numpy().copy()
        a.setflags(write=False)  # as returned by Ray's object store
        named.append((name, a))
    copied = load_buckets_into(dst, bucketize(named, 50_000))
    assert copied == sum(a.nbytes for _, a in named)
    for (name, a), (_, b) in zip(src.state_dict().items(), dst.state_dict().items()):
        assert torch.equal(a, b), name
    assert dst.lm_head.weight is dst.model.embed_tokens.weight


def test_load_buckets_into_rejects_unknown_names_and_shapes(tiny_lm) -> None:
    model = tiny_lm()
    with pytest.raises(KeyError):
        load_buckets_into(model, [{"nope.weight": np.zeros(3, dtype=np.float32)}])
    assert load_buckets_into(model, [{"nope.weight": np.zeros(3, dtype=np.float32)}], strict=False) == 0
    with pytest.raises(ValueError):
        load_buckets_into(model, [{"model.norm.weight": np.zeros(3, dtype=np.float32)}])


def test_per_expert_checkpoint_names_land_in_the_fused_expert_tensors(tmp_path) -> None:
    """A Megatron export carries `experts.<e>.{gate,up,down}_proj.weight`; transformers' Qwen3-MoE holds them fused."""
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    from engine.sync.apply import load_buckets_into
    from engine.trainer.megatron.convert import SafetensorsSource

    cfg = Qwen3MoeConfig(vocab_size=32, hidden_size=16, intermediate_size=32, moe_intermediate_size=8,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                         num_experts=4, num_experts_per_tok=2)
    torch.manual_seed(0)
    source_model = Qwen3MoeForCausalLM(cfg)
    source_model.save_pretrained(tmp_path)
    source = SafetensorsSource(tmp_path)
    assert "model.layers.0.mlp.experts.3.up_proj.weight" in list(source)
    torch.manual_seed(1)
    model = Qwen3MoeForCausalLM(cfg)
    load_buckets_into(model, [{k: source(k).numpy() for k in source}])
    for name, t in source_model.state_dict().items():
        assert torch.equal(model.state_dict()[name], t), name


def test_shared_memory_pieces_ramp_up_at_the_start_and_down_at_the_end() -> None:
    """`ramped`: every tensor exactly once, no piece over the limit unless a tensor alone; the first exported
    bucket starts with its smallest tensors in a piece of at most the ramp size, the last ends likewise (so the
    pieces that cannot overlap with the other side are small); a single bucket ramps both ways."""
    from engine.sync.runtime import ramped

    def t(kib: int) -> torch.Tensor:
        return torch.zeros(kib * 1024, dtype=torch.uint8)

    big, limit, ramp = 96, 64 * 1024, 4 * 1024
    first = {"embed": t(big), **{f"a{i}": t(i % 5 + 1) for i in range(40)}, "mlp0": t(12), "mlp1": t(40)}
    middle = {f"m{i}": t(30) for i in range(6)}
    last = {**{f"z{i}": t(i % 3 + 1) for i in range(30)}, "norm": t(1), "lm_head": t(big)}
    short = {"out": t(big)}  # like a 500M model's last exported bucket: its tied lm_head alone
    for buckets in ([first, middle, last], [first, last], [{**first, **last}], [first, middle, last, short],
                    [first, middle, short]):
        pieces = list(ramped(buckets, limit, ramp))
        names = [n for p in pieces for n in p]
        assert sorted(names) == sorted(n for b in buckets for n in b)  # each tensor once
        for p in pieces:
            assert sum(v.nbytes for v in p.values()) <= limit or len(p) == 1
        assert sum(v.nbytes for v in pieces[0].values()) <= ramp
        assert sum(v.nbytes for v in pieces[-1].values()) <= ramp or list(pieces[-1]) == ["m0"]  # (no smaller)
        assert "embed" not in pieces[0] and "lm_head" not in pieces[-1]
        assert not any(n in pieces[-1] for n in ("embed", "lm_head", "out", "mlp1"))
    pieces = [list(p) for p in ramped([first, middle, last], limit, ramp)]
    between = [list(p) for p in bucketize(middle.items(), limit)]  # the buckets between: split as before
    assert any(pieces[i:i + len(between)] == between for i in range(len(pieces)))
    assert [list(p) for p in ramped([middle], limit, ramp)] != []  # tensors all over the ramp size: still sent
