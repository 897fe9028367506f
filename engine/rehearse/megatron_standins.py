"""The CPU stand-ins a Megatron rank's rehearsal substitutes for Megatron's CUDA-only pieces, one each, named.

`asyncrl rehearse` builds the Megatron rank at the preset's real layout (tp, pp, cp, ep, etp over the fake world,
`engine.rehearse.megatron_rank`); four pieces of the GPU path cannot run on this CPU, on fake tensors or on the
fake process group. `megatron_stand_ins()` and `distributed_optimizer_stand_in()` swap each for the CPU piece below for the
duration of a build, and
`STAND_INS` says which and why (the rehearsal's output repeats it):

    context parallelism   Transformer Engine's `TEDotProductAttention` (ring attention over the CP group) is CUDA
                          only, and megatron-core's local attention refuses cp > 1. Stand-in: `RingAttentionStandIn`,
                          a flash-style attention (`scaled_dot_product_attention`, whose CPU kernel keeps no S × S
                          scores, as TE's fused kernels keep none) of this rank's S/cp query positions against the
                          K/V of the whole CP group (all-gathered over the CP group: an upper bound of the ring's
                          in-flight blocks). Everything else of the CP path is the trainer's own: the
                          load-balanced position split, RoPE, `context_parallel.forward_log_probs` and its
                          chunked head over owned positions (`head.owned_log_probs`), the sum over CP
    distributed optimizer Megatron's `DistributedOptimizer` checks for `torch.cuda.*Tensor` parameters and
                          keeps CUDA overflow buffers. The DDP wrapper is Megatron's own with
                          `use_distributed_optimizer = True` (padded buckets, the gradient reduce-scatter over
                          the data-parallel group of each buffer: DP × CP for dense, expert DP for expert
                          parameters); the optimizer is `DistOptimizerShard`: what the distributed optimizer holds
                          and does on one rank — an fp32 main copy of this rank's 1/N shard of every gradient
                          bucket (N = the buffer's data-parallel size), AdamW's m and v on it (torch's fused
                          AdamW: no temporaries, like TE's/Apex's fused Adam), the step on the fp32 shard of the
                          reduced gradient, and the copy back into the bf16 parameter buffer
    MoE token dispatcher  the all-to-all dispatcher syncs CUDA streams and reads token counts on the host; the CPU's
                          all-gather dispatcher runs (what the plan resolves for CPU: `engine.plan.megatron_perf`)
    RoPE at cp > 1        `get_pos_emb_on_this_cp_rank` builds its index in pinned memory and moves it to CUDA;
                          `cp_rotary_selection` selects the same two chunks on the CPU
    flash attention       with `trainer.use_flash_attn` on CUDA the core attention is Transformer Engine's flash
                          attention at every cp; on the CPU the build would run the local attention (S × S
                          scores): `RingAttentionStandIn` at cp = 1 too (`megatron_stand_ins(flash=True)`)

The stand-ins live here and nowhere in the trainer: the run's own code is unchanged.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from megatron.core.transformer import TransformerConfig

STAND_INS = {
    "context parallelism": "TE ring attention is CUDA-only → flash-style SDPA over this rank's S/cp queries and "
                           "the CP group's all-gathered K/V (the CP split, RoPE and the chunked owned-position "
                           "head are the trainer's own)",
    "distributed optimizer": "Megatron's DistributedOptimizer is CUDA-only → Megatron DDP with "
                             "use_distributed_optimizer (its reduce-scatter) + fused AdamW on this rank's fp32 "
                             "shard of each gradient bucket (fp32 main + m + v)",
    "MoE token dispatcher": "all-to-all is CUDA-only → the all-gather dispatcher (the CPU's setting)",
    "RoPE at cp > 1": "megatron-core's per-CP-rank rotary selection pins host memory and copies to CUDA → the "
                      "same selection on the CPU",
}


class RingAttentionStandIn(torch.nn.Module):
    """Core attention for cp ≥ 1 on the CPU (module docstring): q [s/cp, b, n/tp, d], k, v [s/cp, b, g/tp, d] →
    [s/cp, b, n/tp · d]. Causality is not applied (the values are fake; the memory is the kernel's: inputs,
    output and a log-sum-exp per query)."""

    def __init__(self, config: TransformerConfig, layer_number: int = 1, attn_mask_type: Any = None, attention_type: str = "",
                 attention_dropout: float | None = None, softmax_scale: float | None = None, **_: Any) -> None:
        super().__init__()
        self.config = config
        self.scale = softmax_scale or 1.0 / math.sqrt(config.kv_channels)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: Any = None,
                attn_mask_type: Any = None, attention_bias: Any = None, packed_seq_params: Any = None) -> torch.Tensor:
        from megatron.core import parallel_state as ps
        from megatron.core.tensor_parallel.mappings import gather_from_sequence_parallel_region

        if ps.get_context_parallel_world_size() > 1:
            group = ps.get_context_parallel_group()
            key = gather_from_sequence_parallel_region(key, group=group)
            value = gather_from_sequence_parallel_region(value, group=group)
        s, b, n, d = query.shape
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, heads, s, d]
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=self.scale, enable_gqa=True)
        return out.permute(2, 0, 1, 3).reshape(s, b, n * d)


class DistOptimizerShard:
    """The distributed optimizer's per-rank state and step (module docstring) over Megatron DDP `ddp` built with
    `use_distributed_optimizer = True`. `mains`: this rank's fp32 shards; `step_tensors()`: one AdamW step of them
    on the reduced gradient shards and the copy back into the parameter buffers."""

    def __init__(self, ddp: Any, settings: Any, grad_clip: float) -> None:
        self.shards: list[tuple[torch.Tensor, torch.Tensor]] = []  # (grad shard view, param shard view)
        self.mains: list[torch.Tensor] = []
        for buffer in [*ddp.buffers, *ddp.expert_parallel_buffers]:
            n, r = buffer.data_parallel_world_size, buffer.data_parallel_group.rank()
            for bucket in buffer.buckets:
                size = bucket.grad_data.numel() // n
                grad = bucket.grad_data.view(-1)[r * size:(r + 1) * size]
                param = bucket.param_data.view(-1)[r * size:(r + 1) * size] if bucket.param_data is not None else None
                self.shards.append((grad, param))
                self.mains.append((param if param is not None else grad).detach().float().clone())
        self.settings, self.grad_clip = settings, grad_clip
        self.opt = torch.optim.AdamW(self.mains, lr=settings.lr, betas=settings.betas, eps=settings.eps,
                                     weight_decay=settings.weight_decay, fused=True)

    @property
    def nbytes(self) -> int:
        return sum(m.numel() * m.element_size() for m in self.mains)

    def step_tensors(self) -> None:
        """AdamW on the fp32 shards (their gradients: the reduce-scattered fp32 grad buffer shards, as views),
        then each bf16 parameter shard ← its fp32 main (Megatron then all-gathers the parameter buffers)."""
        for main, (grad, _) in zip(self.mains, self.shards):
            main.grad = grad if grad.dtype == torch.float32 else grad.float()
        self.opt.step()
        with torch.no_grad():
            for main, (_, param) in zip(self.mains, self.shards):
                if param is not None:
                    param.copy_(main)
                main.grad = None

    def step(self, lr: float) -> tuple[float, bool]:  # the backend's protocol; the rehearsal calls step_tensors
        raise RuntimeError("the rehearsal's optimizer stand-in steps fake tensors only (step_tensors)")


def cp_rotary_selection(pos_emb: torch.Tensor, seq_dim: int, cp_group: Any) -> torch.Tensor:
    """megatron-core's `get_pos_emb_on_this_cp_rank` without its pinned-memory CUDA copy: CP rank r keeps chunks
    r and 2·cp − 1 − r of the 2·cp chunks along `seq_dim`."""
    cp, r = cp_group.size(), cp_group.rank()
    idx = torch.tensor([r, 2 * cp - r - 1], device=pos_emb.device)
    pos_emb = pos_emb.view(*pos_emb.shape[:seq_dim], 2 * cp, -1, *pos_emb.shape[seq_dim + 1:])
    pos_emb = pos_emb.index_select(seq_dim, idx)
    return pos_emb.view(*pos_emb.shape[:seq_dim], -1, *pos_emb.shape[seq_dim + 2:])


FLASH_STAND_IN = {"flash attention": "use_flash_attn on CUDA runs Transformer Engine's flash attention, CUDA-only → "
                                      "the same flash-style SDPA at every cp (no S × S scores, as flash keeps none)"}
"""The stand-in `megatron_stand_ins(flash=True)` adds: the rehearsed run uses flash attention (cp = 1 too)."""


@contextlib.contextmanager
def megatron_stand_ins(flash: bool = False) -> Iterator[dict[str, str]]:
    """For the duration: cp > 1 allowed on the CPU with `RingAttentionStandIn` as core attention and RoPE's CP
    selection on the CPU (module docstring); `flash` (the rehearsed run's `trainer.use_flash_attn` on CUDA): the
    stand-in is the core attention at cp = 1 too, as Transformer Engine's flash attention is on the GPU (the CPU
    build would otherwise run the local attention, which keeps the S × S scores). Yields the stand-ins used."""
    from megatron.core.models.common.embeddings import rotary_pos_embedding

    from engine.trainer.megatron import context_parallel
    from engine.trainer.megatron import model as model_module

    saved = (context_parallel.require_cp_support, context_parallel.use_te_attention,
             rotary_pos_embedding.get_pos_emb_on_this_cp_rank, model_module.layer_block_spec)
    block_spec = model_module.layer_block_spec

    def use_stand_in(block_spec: Any) -> None:
        for spec in {id(s): s for s in block_spec.layer_specs}.values():
            spec.submodules.self_attention.submodules.core_attention = RingAttentionStandIn

    def flash_block_spec(config: object, te_attention: bool = False) -> Any:  # as layer_block_spec
        block = block_spec(config, te_attention)
        use_stand_in(block)
        return block

    context_parallel.require_cp_support = lambda cp, pp, on_gpu: None
    context_parallel.use_te_attention = use_stand_in
    rotary_pos_embedding.get_pos_emb_on_this_cp_rank = cp_rotary_selection
    if flash:
        model_module.layer_block_spec = flash_block_spec
    try:
        yield {**STAND_INS, **(FLASH_STAND_IN if flash else {})}
    finally:
        (context_parallel.require_cp_support, context_parallel.use_te_attention,
         rotary_pos_embedding.get_pos_emb_on_this_cp_rank, model_module.layer_block_spec) = saved


@contextlib.contextmanager
def distributed_optimizer_stand_in() -> Iterator[None]:
    """For the duration: trainable ranks are built with the distributed optimizer's DDP and `DistOptimizerShard`
    (module docstring) in place of the CPU's plain DDP and `MainGradAdamW`."""
    from engine.trainer.megatron import backend as backend_module
    from engine.trainer.megatron import optim

    saved = backend_module.build_update

    def build_update(model: Any, layout: Any, on_gpu: bool, settings: Any, grad_clip: float, dtype: Any,
                     fp32_master_weights: bool, perf: Any) -> tuple[Any, Any]:
        ddp = optim.wrap_ddp(model, layout, on_gpu, fp32_master_weights,
                             bool((perf or {}).get("overlap_grad_reduce", False)), distributed_optimizer=True)
        return ddp, DistOptimizerShard(ddp, settings, grad_clip)

    backend_module.build_update = build_update
    try:
        yield
    finally:
        backend_module.build_update = saved
