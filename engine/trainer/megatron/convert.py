"""HF checkpoint tensors ⇄ Megatron-core `GPTModel` parameters (local spec), with TP / EP sharding.

Every Megatron tensor is described by a `Rule`: the HF tensors it is made of and how it is split over
ranks. With t = TP size and r = TP rank:

* `replicated`  — same tensor on every rank (norms, router, row-parallel biases).
* `rows`        — `W.chunk(t, 0)[r]` (column-parallel weights). The fused QKV weight uses this too: Megatron
  stores it per query group g as [q heads of g ; k_g ; v_g] (each head_dim rows), so contiguous groups are
  contiguous rows and a TP shard is a plain row chunk of the fused tensor.
* `cols`        — `W.chunk(t, 1)[r]` (row-parallel weights: o_proj, down_proj).
* `glu`         — fc1 = [gate ; up]; shard r = [gate.chunk(t)[r] ; up.chunk(t)[r]].
* `vocab`       — rows zero-padded to `padded_vocab_size`, then row-chunked.

Routed experts are split over EP first: EP rank e holds global experts e·E/ep … (e+1)·E/ep − 1 as
`local_experts.0 …`, each sharded over the expert-TP group like dense MLPs. HF names are the on-disk
checkpoint names (`mlp.experts.{j}.gate_proj.weight`, what vLLM loads); the fused in-memory layout of
transformers ≥ 5 (`mlp.experts.gate_up_proj [E, 2I, H]`, `down_proj [E, H, I]`) is accepted on input.
The merges in `merge_shards` invert the splits exactly, so HF → Megatron → HF is bit-exact.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.trainer.megatron.hf_config import ArchSpec
from engine.trainer.megatron.model import padded_vocab_size

KINDS = ("replicated", "rows", "cols", "glu", "vocab")


@dataclass(frozen=True)
class Rule:
    """One Megatron tensor: its name, the HF tensors it fuses, its split kind, and which group splits it."""

    megatron: str
    hf: tuple[str, ...]
    kind: str
    expert: bool = False  # split over the expert-TP group (and owned by one EP rank) instead of TP


@dataclass(frozen=True)
class ShardInfo:
    """This rank's coordinates: TP, expert-TP and expert-parallel rank/size."""

    tp_rank: int = 0
    tp_size: int = 1
    etp_rank: int = 0
    etp_size: int = 1
    ep_rank: int = 0
    ep_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1
    first_stage_layers: int | None = None
    last_stage_layers: int | None = None
    """Uneven pipeline stages (`engine.config.megatron_model.stage_layers`); None: the even split."""


def _layer_rules(arch: ArchSpec, i: int, local_experts: Iterable[tuple[int, int]]) -> list[Rule]:
    hf = f"model.layers.{i}."
    mg = f"decoder.layers.{i}."
    att = hf + "self_attn."
    rules = [
        Rule(mg + "input_layernorm.weight", (hf + "input_layernorm.weight",), "replicated"),
        Rule(mg + "self_attention.linear_qkv.weight",
             (att + "q_proj.weight", att + "k_proj.weight", att + "v_proj.weight"), "rows"),
        Rule(mg + "self_attention.linear_proj.weight", (att + "o_proj.weight",), "cols"),
        Rule(mg + "pre_mlp_layernorm.weight", (hf + "post_attention_layernorm.weight",), "replicated"),
    ]
    if arch.qkv_bias:
        rules.append(Rule(mg + "self_attention.linear_qkv.bias",
                          (att + "q_proj.bias", att + "k_proj.bias", att + "v_proj.bias"), "rows"))
    if arch.linear_bias:
        rules.append(Rule(mg + "self_attention.linear_proj.bias", (att + "o_proj.bias",), "replicated"))
    if arch.qk_norm:
        rules.append(Rule(mg + "self_attention.q_layernorm.weight", (att + "q_norm.weight",), "replicated"))
        rules.append(Rule(mg + "self_attention.k_layernorm.weight", (att + "k_norm.weight",), "replicated"))
    if arch.layer_is_moe(i):
        rules.append(Rule(mg + "mlp.router.weight", (hf + "mlp.gate.weight",), "replicated"))
        for local, glob in local_experts:
            src = f"{hf}mlp.experts.{glob}."
            dst = f"{mg}mlp.experts.local_experts.{local}."
            rules.append(Rule(dst + "linear_fc1.weight", (src + "gate_proj.weight", src + "up_proj.weight"),
                              "glu", expert=True))
            rules.append(Rule(dst + "linear_fc2.weight", (src + "down_proj.weight",), "cols", expert=True))
    else:
        mlp = hf + "mlp."
        rules.append(Rule(mg + "mlp.linear_fc1.weight", (mlp + "gate_proj.weight", mlp + "up_proj.weight"), "glu"))
        rules.append(Rule(mg + "mlp.linear_fc2.weight", (mlp + "down_proj.weight",), "cols"))
        if arch.linear_bias:
            rules.append(Rule(mg + "mlp.linear_fc1.bias", (mlp + "gate_proj.bias", mlp + "up_proj.bias"), "glu"))
            rules.append(Rule(mg + "mlp.linear_fc2.bias", (mlp + "down_proj.bias",), "replicated"))
    return rules


def megatron_rules(arch: ArchSpec, ep_rank: int = 0, ep_size: int = 1,
                   layers: Iterable[int] | None = None) -> list[Rule]:
    """All rules of one rank's model (its local experts only), in HF parameter order."""
    per_rank = arch.num_experts // ep_size if arch.num_experts else 0
    local_experts = [(j, ep_rank * per_rank + j) for j in range(per_rank)]
    rules = [Rule("embedding.word_embeddings.weight", ("model.embed_tokens.weight",), "vocab")]
    for i in (range(arch.num_layers) if layers is None else layers):
        rules.extend(_layer_rules(arch, i, local_experts))
    rules.append(Rule("decoder.final_layernorm.weight", ("model.norm.weight",), "replicated"))
    if not arch.tie_word_embeddings:
        rules.append(Rule("output_layer.weight", ("lm_head.weight",), "vocab"))
    return rules


def stage_rules(arch: ArchSpec, info: ShardInfo) -> list[Rule]:
    """The rules of one pipeline stage's model, with Megatron's stage-local layer names.

    Stage s of p holds HF layers o_s … o_s + n_s − 1 as `decoder.layers.0 …` (n_s = L/p, or the uneven split of
    `engine.config.megatron_model.stage_layers`; o_s = Σ_{t<s} n_t); the embedding lives on the
    first stage, the final norm and output layer on the last. With tied embeddings and p > 1 the last stage
    keeps its own copy of the embedding as `output_layer.weight` (Megatron sums the two copies' gradients
    over the embedding group), loaded from `model.embed_tokens.weight`. For p = 1 this is `megatron_rules`.
    """
    if info.pp_size == 1:
        return megatron_rules(arch, info.ep_rank, info.ep_size)
    from engine.config.megatron_model import stage_layers

    sizes = stage_layers(arch.num_layers, info.pp_size, info.first_stage_layers, info.last_stage_layers)
    per = sizes[info.pp_rank]
    first, last = info.pp_rank == 0, info.pp_rank == info.pp_size - 1
    offset = sum(sizes[: info.pp_rank])
    out: list[Rule] = []
    for rule in megatron_rules(arch, info.ep_rank, info.ep_size, range(offset, offset + per)):
        m = re.match(r"decoder\.layers\.(\d+)\.(.*)", rule.megatron)
        if m:
            out.append(Rule(f"decoder.layers.{int(m.group(1)) - offset}.{m.group(2)}", rule.hf, rule.kind,
                            rule.expert))
        elif rule.megatron.startswith("embedding.") and first:
            out.append(rule)
        elif not rule.megatron.startswith("embedding.") and last:
            out.append(rule)
    if last and arch.tie_word_embeddings:
        out.append(Rule("output_layer.weight", ("model.embed_tokens.weight",), "vocab"))
    return out


def fuse_hf(rule: Rule, tensors: list[torch.Tensor], arch: ArchSpec) -> torch.Tensor:
    """The unsharded Megatron tensor from its HF parts (QKV interleaved per query group)."""
    if len(rule.hf) == 3:  # q, k, v → per group [q_g (heads/groups · d) ; k_g (d) ; v_g (d)]
        q, k, v = tensors
        g, d = arch.num_query_groups, arch.head_dim
        per = arch.num_attention_heads // g
        tail = q.shape[1:]
        fused = torch.cat([q.reshape(g, per * d, *tail), k.reshape(g, d, *tail), v.reshape(g, d, *tail)], dim=1)
        return fused.reshape(g * (per + 2) * d, *tail)
    if rule.kind == "glu":
        return torch.cat(tensors, dim=0)
    (t,) = tensors
    return t


def split_hf(rule: Rule, fused: torch.Tensor, arch: ArchSpec) -> list[torch.Tensor]:
    """Inverse of `fuse_hf`: the HF parts of an unsharded Megatron tensor."""
    if len(rule.hf) == 3:
        g, d = arch.num_query_groups, arch.head_dim
        per = arch.num_attention_heads // g
        tail = fused.shape[1:]
        blocks = fused.reshape(g, (per + 2) * d, *tail)
        q, k, v = blocks.split([per * d, d, d], dim=1)
        return [q.reshape(g * per * d, *tail), k.reshape(g * d, *tail), v.reshape(g * d, *tail)]
    if rule.kind == "glu":
        return list(fused.chunk(2, dim=0))
    return [fused]


def shard(rule: Rule, full: torch.Tensor, rank: int, size: int, arch: ArchSpec, tp_for_vocab: int) -> torch.Tensor:
    """This rank's piece of the unsharded Megatron tensor `full` (a contiguous copy)."""
    if rule.kind == "replicated" or (size == 1 and rule.kind != "vocab"):
        return full.clone()
    if rule.kind == "rows":
        return full.chunk(size, dim=0)[rank].clone()
    if rule.kind == "cols":
        return full.chunk(size, dim=1)[rank].clone()
    if rule.kind == "glu":
        gate, up = full.chunk(2, dim=0)
        return torch.cat([gate.chunk(size, dim=0)[rank], up.chunk(size, dim=0)[rank]], dim=0)
    if rule.kind == "vocab":
        padded = padded_vocab_size(arch.vocab_size, tp_for_vocab)
        out = full.new_zeros((padded, *full.shape[1:]))
        out[: full.shape[0]] = full
        return out.chunk(size, dim=0)[rank].clone()
    raise ValueError(f"unknown split kind {rule.kind!r}")


def merge_shards(rule: Rule, shards: list[torch.Tensor], arch: ArchSpec) -> torch.Tensor:
    """Inverse of `shard`: the unsharded Megatron tensor from the shards of ranks 0 … size − 1."""
    if rule.kind == "replicated" or (len(shards) == 1 and rule.kind != "vocab"):
        return shards[0]
    if rule.kind == "rows":
        return torch.cat(shards, dim=0)
    if rule.kind == "cols":
        return torch.cat(shards, dim=1)
    if rule.kind == "glu":
        halves = [s.chunk(2, dim=0) for s in shards]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves], dim=0)
    if rule.kind == "vocab":
        return torch.cat(shards, dim=0)[: arch.vocab_size]
    raise ValueError(f"unknown split kind {rule.kind!r}")


def _split_group(rule: Rule, info: ShardInfo) -> tuple[int, int]:
    return (info.etp_rank, info.etp_size) if rule.expert else (info.tp_rank, info.tp_size)


TensorGetter = Callable[[str], torch.Tensor]


def hf_to_megatron(get: TensorGetter, arch: ArchSpec, info: ShardInfo,
                   layers: Iterable[int] | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """(Megatron name, this rank's shard) for every tensor of this rank, reading HF tensors through `get`."""
    rules = stage_rules(arch, info) if layers is None else megatron_rules(arch, info.ep_rank, info.ep_size, layers)
    for rule in rules:
        full = fuse_hf(rule, [get(n) for n in rule.hf], arch)
        rank, size = _split_group(rule, info)
        yield rule.megatron, shard(rule, full, rank, size, arch, info.tp_size)


@torch.no_grad()
def load_hf_into(params: Mapping[str, torch.nn.Parameter], get: TensorGetter, arch: ArchSpec, info: ShardInfo) -> None:
    """Copy the HF tensors `get` serves into this rank's Megatron `params` (named parameters; shard `info`),
    checking every shape and that Megatron's `tensor_model_parallel` flag agrees with the conversion rule."""
    seen: set[str] = set()
    sharded = {r.megatron for r in stage_rules(arch, info) if is_tp_sharded(r)}
    for name, tensor in hf_to_megatron(get, arch, info):
        p = params.get(name)
        if p is None:
            raise KeyError(f"converted tensor {name!r} has no parameter in the Megatron model")
        if tuple(p.shape) != tuple(tensor.shape):
            raise ValueError(f"{name}: model shape {tuple(p.shape)} != converted {tuple(tensor.shape)}")
        if (name in sharded) != bool(getattr(p, "tensor_model_parallel", False)):
            raise RuntimeError(f"{name}: Megatron's tensor_model_parallel attribute disagrees with the "
                               "conversion rule (gradient norms would be wrong)")
        p.data.copy_(tensor.to(device=p.device, dtype=p.dtype))
        seen.add(name)
    missing = set(params) - seen
    if missing:
        raise KeyError(f"Megatron parameters without an HF source: {sorted(missing)[:5]}")


def is_tp_sharded(rule: Rule) -> bool:
    """Whether the tensor is split over (expert-)TP ranks rather than replicated."""
    return rule.kind != "replicated"


def megatron_to_hf(rule: Rule, shards: list[torch.Tensor], arch: ArchSpec) -> list[tuple[str, torch.Tensor]]:
    """HF (name, tensor) pairs of one Megatron tensor given its shards over its split group."""
    return list(zip(rule.hf, split_hf(rule, merge_shards(rule, shards, arch), arch)))


# ---------------------------------------------------------------------------------------------- HF sources

def _unfuse_experts(name: str, fused: Mapping[str, torch.Tensor]) -> torch.Tensor | None:
    """`model.layers.i.mlp.experts.j.{gate,up,down}_proj.weight` from transformers-5's fused expert tensors."""
    parts = name.split(".")
    if len(parts) != 8 or parts[3] != "mlp" or parts[4] != "experts" or parts[7] != "weight":
        return None
    base, j, proj = ".".join(parts[:5]), int(parts[5]), parts[6]
    if proj in ("gate_proj", "up_proj") and base + ".gate_up_proj" in fused:
        gate, up = fused[base + ".gate_up_proj"][j].chunk(2, dim=0)
        return gate if proj == "gate_proj" else up
    if proj == "down_proj" and base + ".down_proj" in fused:
        return fused[base + ".down_proj"][j]
    return None


def state_dict_getter(state_dict: Mapping[str, torch.Tensor]) -> TensorGetter:
    """A `TensorGetter` over an in-memory HF state dict (checkpoint or transformers-5 fused-expert names)."""

    def get(name: str) -> torch.Tensor:
        if name in state_dict:
            return state_dict[name].detach()
        t = _unfuse_experts(name, state_dict)
        if t is None:
            raise KeyError(f"HF tensor {name!r} not found")
        return t.detach()

    return get


class SafetensorsSource:
    """Lazy reader of an HF model directory's `*.safetensors` (one tensor read at a time)."""

    def __init__(self, hf_model_dir: str | Path) -> None:
        from safetensors import safe_open

        root = Path(hf_model_dir)
        index = root / "model.safetensors.index.json"
        if index.exists():
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        else:
            files = sorted(p.name for p in root.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no *.safetensors in {root}")
        self._handles = [safe_open(str(root / f), framework="pt") for f in files]
        self._where = {k: h for h in self._handles for k in h.keys()}  # noqa: SIM118 (safe_open is no dict)
        self._fused = _LazyMapping(self)

    def keys(self) -> list[str]:
        return list(self._where)

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __contains__(self, name: object) -> bool:
        return name in self._where

    def __len__(self) -> int:
        return len(self._where)

    def raw(self, name: str) -> torch.Tensor:
        return self._where[name].get_tensor(name)

    def __call__(self, name: str) -> torch.Tensor:
        if name in self._where:
            return self.raw(name)
        t = _unfuse_experts(name, self._fused)
        if t is None:
            raise KeyError(f"HF tensor {name!r} not found in the checkpoint")
        return t


class _LazyMapping(Mapping[str, torch.Tensor]):
    def __init__(self, src: SafetensorsSource) -> None:
        self._src = src

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._src.raw(name)

    def __contains__(self, name: object) -> bool:
        return name in self._src._where

    def __iter__(self) -> Iterator[str]:
        return iter(self._src._where)

    def __len__(self) -> int:
        return len(self._src._where)
