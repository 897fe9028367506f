"""Log-probs and entropy from vocab-parallel logits without gathering the vocabulary.

Rank r of a TP group holds logits z_v for v in its slice [v₀, v₀ + V/t) of the (padded) vocabulary.
Padding ids v ≥ V_real are excluded (z_v = −∞). With all-reduces over the TP group:

    M = max_v z_v                       (all-reduce max, no gradient: the result does not depend on M)
    S = Σ_v exp(z_v − M)                (all-reduce sum)
    log π(y) = z_y − M − log S          (z_y all-reduce summed from the rank that owns y)
    H = M + log S − (Σ_v exp(z_v − M) · z_v) / S

The sums use Megatron's `reduce_from_tensor_model_parallel_region` (all-reduce forward, identity
backward), which is the correct gradient because every TP rank computes the same loss from the reduced
values. With TP = 1 this is exactly `log_softmax` and the entropy of `softmax`.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def _tp():
    from megatron.core import parallel_state as ps

    return ps.get_tensor_model_parallel_group(), ps.get_tensor_model_parallel_world_size(), \
        ps.get_tensor_model_parallel_rank()


def _reduce_sum(x: torch.Tensor) -> torch.Tensor:
    from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region

    return reduce_from_tensor_model_parallel_region(x)


def vocab_parallel_log_probs(
    logits: torch.Tensor, targets: torch.Tensor, real_vocab: int, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log π(targets) [...] (fp32) and optionally the entropy [...] from this rank's logits [..., V/t].

    `logits` are already divided by the temperature; `targets` hold global token ids.
    """
    group, size, rank = _tp()
    z = logits.float()
    local_vocab = z.shape[-1]
    start = rank * local_vocab
    ids = torch.arange(start, start + local_vocab, device=z.device)
    pad = ids >= real_vocab
    if bool(pad.any()):
        z = z.masked_fill(pad, float("-inf"))
    m = z.detach().max(dim=-1).values
    if size > 1:
        dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
    e = torch.exp(z - m.unsqueeze(-1))
    s = _reduce_sum(e.sum(dim=-1))
    local = targets - start
    owned = (local >= 0) & (local < local_vocab)
    z_y = z.gather(-1, local.clamp(0, local_vocab - 1).unsqueeze(-1)).squeeze(-1)
    z_y = _reduce_sum(torch.where(owned, z_y, torch.zeros_like(z_y)))
    log_s = torch.log(s)
    log_p = z_y - m - log_s
    if not with_entropy:
        return log_p, None
    ez = _reduce_sum((e * z.masked_fill(pad, 0.0)).sum(dim=-1))
    return log_p, m + log_s - ez / s
