"""HF ⇄ Megatron tensor conversion with TP / EP sharding, as pure tensor functions (no process group)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from megatron_helpers import KINDS, tiny_hf_model

from engine.trainer.megatron.convert import (
    Rule,
    SafetensorsSource,
    ShardInfo,
    fuse_hf,
    hf_to_megatron,
    megatron_rules,
    merge_shards,
    shard,
    split_hf,
    state_dict_getter,
)
from engine.trainer.megatron.hf_config import load_arch


def _round_trip(directory: Path, tp: int, ep: int) -> dict[str, torch.Tensor]:
    """HF → Megatron shards of every (tp_rank, ep_rank) → merged back into HF tensors."""
    arch = load_arch(directory)
    source = SafetensorsSource(directory)
    per_rank = {
        (t, e): dict(hf_to_megatron(source, arch, ShardInfo(t, tp, t, tp, e, ep)))
        for t in range(tp) for e in range(ep if arch.num_experts else 1)
    }
    out: dict[str, torch.Tensor] = {}
    for e in range(ep if arch.num_experts else 1):
        for rule in megatron_rules(arch, e, ep):
            shards = [per_rank[(t, e)][rule.megatron] for t in range(tp)]
            for name, tensor in zip(rule.hf, split_hf(rule, merge_shards(rule, shards, arch), arch)):
                out[name] = tensor
    return out


LAYOUTS = [(k, tp, 1) for k in KINDS for tp in (1, 2)] + [("qwen3_moe", 1, 2), ("qwen3_moe", 2, 2)]


@pytest.mark.parametrize("kind, tp, ep", LAYOUTS)
def test_hf_megatron_hf_round_trip_is_bit_exact(hf_dirs: dict[str, Path], kind: str, tp: int, ep: int) -> None:
    source = SafetensorsSource(hf_dirs[kind])
    back = _round_trip(hf_dirs[kind], tp, ep)
    assert set(back) == set(source.keys())
    for name, tensor in back.items():
        assert torch.equal(tensor, source(name)), name


def test_every_tp_rank_gets_a_distinct_equal_sized_shard(hf_dirs: dict[str, Path]) -> None:
    arch = load_arch(hf_dirs["qwen3"])
    source = SafetensorsSource(hf_dirs["qwen3"])
    r0 = dict(hf_to_megatron(source, arch, ShardInfo(0, 2, 0, 2)))
    r1 = dict(hf_to_megatron(source, arch, ShardInfo(1, 2, 1, 2)))
    qkv = "decoder.layers.0.self_attention.linear_qkv.weight"
    assert r0[qkv].shape == (arch.num_query_groups // 2 * (arch.num_attention_heads // arch.num_query_groups + 2)
                             * arch.head_dim, arch.hidden_size)
    assert not torch.equal(r0[qkv], r1[qkv])
    norm = "decoder.layers.0.input_layernorm.weight"
    assert torch.equal(r0[norm], r1[norm])
    emb = "embedding.word_embeddings.weight"
    assert r0[emb].shape[0] == r1[emb].shape[0] == 31  # vocab 61 padded to 62
    assert torch.count_nonzero(r1[emb][-1]) == 0  # the padding row is zero


def test_qkv_is_interleaved_per_query_group() -> None:
    """Megatron's fused QKV holds, for each KV group g: the q heads of g, then k_g, then v_g."""
    arch = load_arch_like(heads=4, groups=2, head_dim=2)
    q = torch.arange(4 * 2).float().repeat_interleave(3).reshape(8, 3)
    k = 100 + torch.arange(2 * 2).float().repeat_interleave(3).reshape(4, 3)
    v = 200 + torch.arange(2 * 2).float().repeat_interleave(3).reshape(4, 3)
    rule = Rule("qkv", ("q", "k", "v"), "rows")
    fused = fuse_hf(rule, [q, k, v], arch)[:, 0].tolist()
    assert fused == [0, 1, 2, 3, 100, 101, 200, 201, 4, 5, 6, 7, 102, 103, 202, 203]
    assert [t.tolist() for t in split_hf(rule, fuse_hf(rule, [q, k, v], arch), arch)] == \
        [q.tolist(), k.tolist(), v.tolist()]


def test_glu_shard_holds_gate_then_up_slices() -> None:
    arch = load_arch_like(heads=2, groups=2, head_dim=2)
    gate, up = torch.arange(4.0).reshape(4, 1), 10 + torch.arange(4.0).reshape(4, 1)
    rule = Rule("fc1", ("gate", "up"), "glu")
    full = fuse_hf(rule, [gate, up], arch)
    assert shard(rule, full, 1, 2, arch, 2).flatten().tolist() == [2, 3, 12, 13]
    merged = merge_shards(rule, [shard(rule, full, r, 2, arch, 2) for r in range(2)], arch)
    assert torch.equal(merged, full)


def test_expert_parallel_ranks_own_disjoint_experts(hf_dirs: dict[str, Path]) -> None:
    arch = load_arch(hf_dirs["qwen3_moe"])
    owned = [{n for r in megatron_rules(arch, e, 2) for n in r.hf if ".experts." in n} for e in range(2)]
    assert owned[0].isdisjoint(owned[1])
    assert {n.split(".")[5] for n in owned[0]} == {"0", "1"} and {n.split(".")[5] for n in owned[1]} == {"2", "3"}


def test_transformers_fused_expert_layout_is_accepted(hf_dirs: dict[str, Path]) -> None:
    """transformers ≥ 5 keeps experts as [E, 2I, H] / [E, H, I] in memory; the on-disk names are per expert."""
    live = tiny_hf_model("qwen3_moe").state_dict()
    assert "model.layers.0.mlp.experts.gate_up_proj" in live
    get = state_dict_getter(live)
    disk = SafetensorsSource(hf_dirs["qwen3_moe"])
    for name in disk:
        assert torch.equal(get(name), disk(name)), name


def load_arch_like(heads: int, groups: int, head_dim: int):
    from engine.trainer.megatron.hf_config import arch_from_hf_config

    return arch_from_hf_config({
        "model_type": "qwen3", "hidden_size": heads * head_dim, "num_attention_heads": heads,
        "num_key_value_heads": groups, "head_dim": head_dim, "num_hidden_layers": 1, "intermediate_size": 4,
        "vocab_size": 8,
    })
