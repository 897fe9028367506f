"""GRPO group-normalised advantages (outcome reward, one scalar per trajectory).

For a group g (the `n` trajectories sampled for one prompt) with rewards r_1..r_n:

    mean_g = (1/n) Σ_i r_i
    std_g  = sqrt( Σ_i (r_i − mean_g)² / (n − 1) )        # unbiased (Bessel), like verl's `torch.std`
    A_i    = (r_i − mean_g) / (std_g + eps)               # norm_by_std = True  (GRPO)
    A_i    =  r_i − mean_g                                # norm_by_std = False (Dr.GRPO)

A group of a single trajectory uses mean 0 and std 1, exactly as verl does, so its advantage is r/(1 + eps)
(or r without std-normalisation). A group whose rewards are all equal gets exactly A = 0 for every member (set, not computed: in floating point
mean_g of n copies of 0.1 is not 0.1, and the rounding residue divided by std_g + eps would leave |A| ~ 1e-3 —
enough to hide the group from `zero_adv_fraction` and `skip_zero_advantage`).
The per-trajectory advantage is broadcast to every response token: A[b, t] = A_b · m[b, t].
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def grpo_advantages(
    rewards: torch.Tensor,
    group_ids: Sequence[object] | torch.Tensor | None = None,
    *,
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Per-trajectory GRPO advantages, same shape as `rewards` (formula in the module docstring).

    rewards: `[N]` with `group_ids` (length N, any hashable ids; members of a group need not be contiguous),
    or `[G, n]` with `group_ids=None`, one group per row.
    """
    if rewards.dim() == 2 and group_ids is None:
        g, n = rewards.shape
        flat = rewards.reshape(-1)
        ids: list[object] = [i // n for i in range(g * n)] if n > 0 else []
        return _grouped(flat, ids, norm_by_std, eps).reshape(g, n)
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be [N] with group_ids or [G, n] without; got shape {tuple(rewards.shape)}")
    if group_ids is None:
        raise ValueError("group_ids is required for 1-D rewards")
    ids = group_ids.tolist() if isinstance(group_ids, torch.Tensor) else list(group_ids)
    if len(ids) != rewards.shape[0]:
        raise ValueError(f"group_ids has {len(ids)} entries but rewards has {rewards.shape[0]}")
    return _grouped(rewards, ids, norm_by_std, eps)


def _grouped(rewards: torch.Tensor, ids: list[object], norm_by_std: bool, eps: float) -> torch.Tensor:
    scores = rewards.detach().to(torch.float32 if not rewards.is_floating_point() else rewards.dtype)
    members: dict[object, list[int]] = {}
    for i, gid in enumerate(ids):
        members.setdefault(gid, []).append(i)
    out = torch.empty_like(scores)
    for idx in members.values():
        index = torch.tensor(idx, dtype=torch.long, device=scores.device)
        group = scores.index_select(0, index)
        if group.numel() == 1:
            mean, std = torch.zeros((), dtype=scores.dtype), torch.ones((), dtype=scores.dtype)
        else:
            mean, std = group.mean(), group.std()
        if group.numel() > 1 and bool(group.eq(group[0]).all()):
            adv = torch.zeros_like(group)
        else:
            adv = (group - mean) / (std + eps) if norm_by_std else group - mean
        out.index_copy_(0, index, adv)
    return out


def broadcast_advantages(advantages: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Token-level advantages `[B, R]`: A[b, t] = advantages[b] · response_mask[b, t]."""
    if advantages.dim() != 1 or advantages.shape[0] != response_mask.shape[0]:
        raise ValueError(
            f"advantages {tuple(advantages.shape)} must be [B] matching response_mask {tuple(response_mask.shape)}"
        )
    return advantages.to(response_mask.dtype if response_mask.is_floating_point() else torch.float32)[:, None] * response_mask
