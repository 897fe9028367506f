"""The Megatron trainer's performance settings (`[trainer]` keys, Megatron's and verl's names), a base of
`TrainerConfig`. Each is "auto" by default and resolved per device by `engine.plan.megatron_perf` (what the
device supports; `launch --dry-run` prints the result). Pure pydantic."""

from __future__ import annotations

from typing import Literal

from engine.config.section import Section

Auto = Literal["auto"]


class MegatronPerfConfig(Section):
    """Megatron performance settings, resolved per device (`engine.plan.megatron_perf.resolve_perf`)."""

    moe_token_dispatcher_type: Literal["auto", "alltoall", "allgather"] = "auto"
    """megatron, MoE: how tokens reach their experts (Megatron's key). `alltoall` = each rank sends each token
    only to the EP ranks holding its experts (verl's and Megatron's choice for EP > 1); `allgather` = every rank
    gathers every token of its EP group (the CPU / gloo path). auto: `alltoall` on cuda / npu with ep > 1, else
    `allgather`."""
    use_distributed_optimizer: bool | Auto = "auto"
    """megatron: Megatron's distributed optimizer (fp32 masters and Adam state sharded over the data-parallel
    ranks, Megatron's key). auto: on cuda; off on CPU / NPU, where `MainGradAdamW` keeps the same math unsharded
    (Megatron's distributed optimizer needs CUDA)."""
    overlap_grad_reduce: bool | Auto = "auto"
    """megatron: reduce each gradient bucket over the data-parallel ranks as soon as the last micro-batch's
    backward has filled it, overlapping the reduction with the rest of the backward (Megatron's key; verl's
    `override_ddp_config.overlap_grad_reduce`). The earlier micro-batches run under `no_sync`. auto: on with the
    distributed optimizer (cuda), off elsewhere."""
    optimizer_offload: bool = False
    """megatron, cuda: keep the distributed optimizer's fp32 masters and Adam moments in host memory and step
    them there (Megatron's `optimizer_cpu_offload`, fraction 1.0; verl's `actor.megatron.optimizer_offload`): the
    GPU keeps the bf16 weights and fp32 gradients only, at the cost of host memory (12 bytes per parameter over
    the data-parallel ranks) and a host Adam step. What lets a 671B–1T MoE trainer fit 80 GB GPUs."""
    use_flash_attn: bool = False
    """megatron: the attention kernel (verl's `override_transformer_config.use_flash_attn`). True, on CUDA:
    Transformer Engine's core attention with Megatron's flash backend (same attention, O(S) memory); on CPU (and
    anywhere without CUDA) the local, unfused softmax(QKᵀ/√d)·V runs, and `launch --dry-run` says so. False:
    the local attention everywhere (the default: the local spec needs no Transformer Engine)."""
