"""Context parallelism (CP > 1) for the Megatron backend — CUDA with Transformer Engine only.

Why only there (megatron-core 0.16.1): the local `DotProductAttention` asserts
`context_parallel_size == 1` ("Context parallelism is only supported by TEDotProductAttention!"); the ring
attention that exchanges K/V blocks between CP ranks is Transformer Engine's, and TE is a CUDA library.
So on CPU cp > 1 is refused (`require_cp_support`), and on CUDA the layer spec keeps Megatron's local
linears and norms (so the HF conversion is unchanged) with `core_attention = TEDotProductAttention`.

Sequence split (Megatron's `get_batch_on_this_cp_rank`, load-balanced for causal attention): the packed
row of length S (a multiple of 2·cp·tp) is cut into 2·cp chunks of c = S / (2·cp); CP rank r holds chunks
r and 2·cp − 1 − r, in that order. Megatron's RoPE selects the same positions itself. Rows are
left-aligned with padding at the end (`inputs.pack_batch`), so plain causal attention (no mask) computes
exactly what the padded mask computes for every real token.

Log-probs: each CP rank gathers the logits of the response positions it holds — only those, compacted and
chunked like the cp = 1 head (`engine.trainer.megatron.head.owned_log_probs`: at most `logprob_chunk_tokens`
fp32 positions × V/tp at once) —, computes their vocab-parallel log-probs and zeroes the others; a sum over the
CP group gives every CP rank the full [b, R]. The backward of that sum passes each rank's own positions' gradient through unchanged, so rank r's
parameter gradient is the part of ∂L/∂θ flowing through its tokens; Megatron DDP averages gradients over
DP × CP, so the backend scales the loss by dp · cp (as Megatron multiplies by cp) and the sum over CP ranks
is the full gradient. This path has not run here (no CUDA, no TE on the development machine).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from engine.trainer.megatron.parallel import ParallelConfigError

CPU_REASON = ("context parallelism (cp > 1) needs Transformer Engine's attention (megatron-core's local "
              "attention supports cp = 1 only), and Transformer Engine needs CUDA")


def te_available() -> bool:
    """Whether megatron-core found Transformer Engine."""
    try:
        from megatron.core.extensions import transformer_engine as te_ext
    except Exception:  # noqa: BLE001 - any import failure means: no TE
        return False
    return bool(getattr(te_ext, "HAVE_TE", False))


def require_cp_support(cp: int, pp: int, on_gpu: bool) -> None:
    """Raise `ParallelConfigError` when cp > 1 cannot run here (see the module docstring)."""
    if cp == 1:
        return
    if not on_gpu:
        raise ParallelConfigError(f"{CPU_REASON}; on CPU use cp = 1")
    if pp > 1:
        raise ParallelConfigError("cp > 1 together with pp > 1 is not supported by this backend; use pp = 1")
    if not te_available():
        raise ParallelConfigError(f"{CPU_REASON}: install transformer-engine[pytorch] for cp = {cp}")


def use_te_attention(block_spec: Any) -> None:
    """Set `core_attention = TEDotProductAttention` in every layer spec of a local block spec (in place)."""
    from megatron.core.extensions.transformer_engine import TEDotProductAttention

    for spec in {id(s): s for s in block_spec.layer_specs}.values():
        spec.submodules.self_attention.submodules.core_attention = TEDotProductAttention


def chunk_positions(seq: int, cp: int, rank: int) -> torch.Tensor:
    """The global sequence positions CP rank `rank` holds, in its local order (chunks r and 2cp−1−r)."""
    if seq % (2 * cp):
        raise ValueError(f"sequence length {seq} is not a multiple of 2·cp = {2 * cp}")
    c = seq // (2 * cp)
    return torch.cat([torch.arange(rank * c, (rank + 1) * c), torch.arange((2 * cp - 1 - rank) * c, (2 * cp - rank) * c)])


def local_response_index(response_index: torch.Tensor, seq: int, cp: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(local index [b, R], owned [b, R] bool): where this rank's logits for each response position are
    (0 where it does not hold the position)."""
    positions = chunk_positions(seq, cp, rank).to(response_index.device)
    where = torch.full((seq,), -1, dtype=torch.long, device=response_index.device)
    where[positions] = torch.arange(positions.numel(), device=response_index.device)
    local = where[response_index]
    owned = local >= 0
    return local.clamp(min=0), owned


class _SumOverCP(torch.autograd.Function):
    """Forward: the sum over the CP group. Backward: the upstream gradient, unchanged (see the docstring)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:  # noqa: ARG004
        out = x.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # noqa: ARG004
        return grad, None


def sum_over_cp(x: torch.Tensor, group: Any) -> torch.Tensor:
    return _SumOverCP.apply(x, group)


def forward_log_probs(backend: Any, inp: Any, responses: torch.Tensor, with_entropy: bool,
                      rows: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log π [rows, R] (and entropy) for packed inputs `inp` (already on the device, S a multiple of
    2·cp·tp), computed across the CP group as in the module docstring: each rank's head runs on the response
    positions it owns only, chunked (`head.owned_log_probs`)."""
    from megatron.core import parallel_state as ps

    from engine.trainer.megatron.head import owned_log_probs

    cp, rank, group = ps.get_context_parallel_world_size(), ps.get_context_parallel_rank(), \
        ps.get_context_parallel_group()
    seq = inp.shape[1]
    positions = chunk_positions(seq, cp, rank).to(inp.tokens.device)
    tokens = inp.tokens[:, positions]
    logits = backend.ddp(tokens, inp.position_ids[:, positions], None)[:rows]  # [b, S/cp, V/tp]
    local, owned = local_response_index(inp.response_index[:rows], seq, cp, rank)
    lp, ent = owned_log_probs(logits, local, owned, responses, temperature=backend.temperature,
                              vocab_size=backend.arch.vocab_size, chunk_tokens=backend.logprob_chunk_tokens,
                              with_entropy=with_entropy)
    lp = sum_over_cp(lp, group)
    ent = sum_over_cp(ent, group) if ent is not None else None
    return lp, ent
