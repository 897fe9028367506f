"""Megatron parameters → full HF-named tensors (weight sync to the rollout, and checkpoint export).

Each TP-split tensor is gathered over its split group (TP, or expert-TP for experts) and merged by
`convert.megatron_to_hf`; routed experts are then gathered over the EP group, local expert j of EP rank e
being global expert e·E/ep + j. Every rank takes part in the collectives.

Two modes. `to_sender=False` (`hf_state_dict`): all-gathers, every rank yields the same full tensors.
`to_sender=True` (the weight sync, `export_hf`, without pipeline parallelism): each gather goes only to its
group's first rank — TP shards to the TP group's first rank, expert-TP shards to the expert-TP first rank, and
the experts of an EP group to that group's first rank (only expert-TP-first ranks take part in it) — so
global rank 0, the sender, ends with every full tensor and no other rank holds more than its own shards plus
its group's gathers. Per tensor of size S over a group of g ranks, the bytes a rank receives are (g−1)·S/g·g
= (g−1)·S on the first rank and 0 elsewhere, against (g−1)·S on *every* rank for the all-gather
(`gathered_bytes` counts them). With pipeline parallelism each stage gathers its
own layers (HF layer names restored from the stage offset), then the stages take turns: stage s
broadcasts each of its tensors over the pipeline group (a header (name, shape, dtype) then the data), so
one tensor at a time is in flight and no rank ever holds the whole model. The last stage's tied copy of
the embedding is not exported twice. `lm_head.weight` is always included — for tied
embeddings it is the embedding matrix — because vLLM leaves the LM head stale otherwise.

The export keeps the model's dtype (bf16 stays bf16): the weight sync packs the tensors into its flat
buffers as they are (`engine.sync.flat`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import torch
import torch.distributed as dist

from engine.sync.buckets import Bucket, bucketize
from engine.trainer.megatron.convert import ShardInfo, megatron_to_hf, stage_rules
from engine.trainer.megatron.hf_config import ArchSpec

_EXPERT = re.compile(r"\.experts\.(\d+)\.")


gathered_bytes = 0
"""Bytes this rank received in export gathers since the process started (the weight-sync study reads it)."""


def _all_gather(t: torch.Tensor, group: object, size: int) -> list[torch.Tensor]:
    global gathered_bytes
    if size == 1:
        return [t]
    t = t.contiguous()
    out = [torch.empty_like(t) for _ in range(size)]
    dist.all_gather(out, t, group=group)
    gathered_bytes += (size - 1) * t.numel() * t.element_size()
    return out


def _gather_to_first(t: torch.Tensor, group: object, size: int) -> list[torch.Tensor] | None:
    """The shards of `group` on its first rank (group rank 0); None on the others."""
    global gathered_bytes
    if size == 1:
        return [t]
    t = t.contiguous()
    first = dist.get_global_rank(group, 0)
    if dist.get_rank() != first:
        dist.gather(t, None, dst=first, group=group)
        return None
    out = [torch.empty_like(t) for _ in range(size)]
    dist.gather(t, out, dst=first, group=group)
    gathered_bytes += (size - 1) * t.numel() * t.element_size()
    return out


def current_shard_info() -> ShardInfo:
    """This rank's TP / expert-TP / EP coordinates from Megatron's parallel state."""
    from megatron.core import parallel_state as ps

    from engine.trainer.megatron.parallel import STAGE_SPLIT

    return ShardInfo(
        tp_rank=ps.get_tensor_model_parallel_rank(), tp_size=ps.get_tensor_model_parallel_world_size(),
        etp_rank=ps.get_expert_tensor_parallel_rank(), etp_size=ps.get_expert_tensor_parallel_world_size(),
        ep_rank=ps.get_expert_model_parallel_rank(), ep_size=ps.get_expert_model_parallel_world_size(),
        pp_rank=ps.get_pipeline_model_parallel_rank(), pp_size=ps.get_pipeline_model_parallel_world_size(),
        first_stage_layers=STAGE_SPLIT[0], last_stage_layers=STAGE_SPLIT[1],
    )


def current_ep() -> tuple[int, int]:
    """(EP rank, EP size) of this rank."""
    info = current_shard_info()
    return info.ep_rank, info.ep_size


@torch.no_grad()
def iter_hf_tensors(model: torch.nn.Module, arch: ArchSpec,
                    to_sender: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, full tensor) for every HF weight, gathered from all TP / EP / PP ranks (`model`: a GPTModel).
    `to_sender` (no pipeline parallelism): only global rank 0 gets (and yields) the full tensors."""
    from megatron.core import parallel_state as ps

    info = current_shard_info()
    if info.pp_size == 1:
        yield from _stage_tensors(model, arch, info, to_sender)
        return
    group = ps.get_pipeline_model_parallel_group()
    embed: torch.Tensor | None = None
    for stage in range(info.pp_size):
        src = dist.get_global_rank(group, stage)
        mine = _stage_tensors(model, arch, info) if stage == info.pp_rank else None
        while True:
            item = next(mine, None) if mine is not None else None
            header = [None if item is None else (item[0], tuple(item[1].shape), item[1].dtype)]
            dist.broadcast_object_list(header, src=src, group=group)
            if header[0] is None:
                break
            name, shape, dtype = header[0]
            tensor = item[1].contiguous() if item is not None else torch.empty(shape, dtype=dtype,
                                                                               device=_device(model))
            dist.broadcast(tensor, src=src, group=group)
            if name == "model.embed_tokens.weight":
                embed = tensor
            if name != "lm_head.weight" or not arch.tie_word_embeddings:
                yield name, tensor
    if arch.tie_word_embeddings:
        assert embed is not None
        yield "lm_head.weight", embed


def _device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def _stage_tensors(model: torch.nn.Module, arch: ArchSpec, info: ShardInfo,
                   to_sender: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
    """This stage's HF tensors, gathered over TP / EP (the HF names of `megatron_rules`); with `to_sender` each
    gather goes to its group's first rank and a rank yields only what it holds in full as a sender."""
    from megatron.core import parallel_state as ps

    params = dict(model.named_parameters())
    tp_group, etp_group, ep_group = (ps.get_tensor_model_parallel_group(), ps.get_expert_tensor_parallel_group(),
                                     ps.get_expert_model_parallel_group())
    per_rank = arch.num_experts // info.ep_size if arch.num_experts else 0
    embed: torch.Tensor | None = None
    for rule in stage_rules(arch, info):  # stage-local Megatron names, global HF names
        if rule.megatron == "output_layer.weight" and arch.tie_word_embeddings:
            continue  # the last stage's copy of the tied embedding
        local = params[rule.megatron].detach()
        gather = _gather_to_first if to_sender else _all_gather
        if rule.kind == "replicated":
            shards = [local]
        elif rule.expert:
            shards = gather(local, etp_group, info.etp_size)
        else:
            shards = gather(local, tp_group, info.tp_size)
        if shards is None:
            continue  # not this group's first rank: its shard went to the sender
        for name, tensor in megatron_to_hf(rule, shards, arch):
            if rule.expert and info.ep_size > 1:
                j = int(_EXPERT.search(name).group(1)) - info.ep_rank * per_rank
                gathered = gather(tensor, ep_group, info.ep_size)
                for e, t in enumerate(gathered or []):
                    yield _EXPERT.sub(f".experts.{e * per_rank + j}.", name, count=1), t
            elif to_sender and (info.tp_rank or info.ep_rank):
                continue  # dense tensors: a copy of the sender's (another DP / EP rank of the same TP rank)
            else:
                if name == "model.embed_tokens.weight":
                    embed = tensor
                yield name, tensor
    if arch.tie_word_embeddings and info.pp_size == 1 and embed is not None:
        yield "lm_head.weight", embed


def export_hf(model: torch.nn.Module, arch: ArchSpec, bucket_bytes: int) -> Iterator[Bucket]:
    """HF-named tensor buckets of ~`bucket_bytes` in the model's dtype (see `engine.sync.buckets.bucketize`);
    tensors may be the live (replicated) weights."""
    return bucketize(iter_hf_tensors(model, arch, to_sender=current_shard_info().pp_size == 1), bucket_bytes)
