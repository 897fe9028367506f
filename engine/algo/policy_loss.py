"""Loss aggregation and the policy-gradient losses (PPO-clip with dual-clip, REINFORCE), verl semantics.

Aggregation of a per-token loss matrix ℓ [B, R] with mask m (`agg_loss`):

    token-mean          : Σ_bt ℓ·m / D,            D = Σ_bt m                  (tokens)
    seq-mean-token-sum  : Σ_b (Σ_t ℓ·m) / D,       D = #{b : Σ_t m_bt > 0}     (non-empty rows)
    seq-mean-token-mean : Σ_b (Σ_t ℓ·m / (Σ_t m + 1e-8)) / D,  same D

`denominator` overrides D — a trainer that splits a batch into micro-batches normalises each by its own D and
weights it with `engine.algo.loss.micro_batch_weight` (or passes the global D directly). D = 0 gives a zero loss
that still carries a graph, instead of verl's 0/0.

PPO-clip (`ppo_clip_loss`), r_t = exp(clamp(log π_θ − log π_old, −20, 20)), A the advantage, w the optional
rollout-correction IS weight (detached):

    ℓ¹ = −A·r,   ℓ² = −A·clip(r, 1 − ε_low, 1 + ε_high),   ℓ_clip = max(ℓ¹, ℓ²)
    ℓ  = min(ℓ_clip, −A·c)   if A < 0   (dual-clip, c = clip_ratio_c > 1)   else ℓ_clip
    L  = agg(w·ℓ)
    pg_clipfrac       = masked_mean(1[ℓ² > ℓ¹])
    pg_clipfrac_lower = masked_mean(1[ℓ_clip > −A·c] · 1[A < 0])
    ppo_kl            = masked_mean(log π_old − log π_θ)   (clamped like r)

REINFORCE (`reinforce_loss`, bypass mode `loss_type="reinforce"`): L = agg(−A · log π_θ · w), w detached (the
truncated IS weight π_θ/π_rollout, or 1), no clipping; ppo_kl = masked_mean(log π_rollout − log π_θ).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from engine.algo.stats import masked_mean, masked_sum, valid_rows

AggMode = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"]
AGG_MODES: tuple[str, ...] = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")
LOG_RATIO_CLAMP = 20.0


def agg_denominator(mask: torch.Tensor, mode: str) -> float:
    """D of `agg_loss` for `mask`: valid tokens (token-mean) or non-empty rows (seq-mean-*)."""
    if mode == "token-mean":
        return float(mask.sum().item())
    if mode in ("seq-mean-token-sum", "seq-mean-token-mean"):
        return float(valid_rows(mask).sum().item())
    raise ValueError(f"unknown loss_agg_mode {mode!r}; expected one of {AGG_MODES}")


def agg_loss(loss_mat: torch.Tensor, mask: torch.Tensor, mode: str, denominator: float | None = None) -> torch.Tensor:
    """Aggregate a per-token loss [B, R] to a scalar (formulas in the module docstring)."""
    if loss_mat.shape != mask.shape:
        raise ValueError(f"loss {tuple(loss_mat.shape)} and mask {tuple(mask.shape)} differ in shape")
    denom = agg_denominator(mask, mode) if denominator is None else float(denominator)
    if mode == "token-mean":
        total = masked_sum(loss_mat, mask)
    else:
        seq = masked_sum(loss_mat, mask, dim=-1)
        if mode == "seq-mean-token-mean":
            seq = seq / (mask.to(loss_mat.dtype).sum(dim=-1) + 1e-8)
        total = (seq * valid_rows(mask).to(loss_mat.dtype)).sum()
    if denom <= 0:
        return total * 0.0
    return total / denom


@dataclass
class PolicyLossOutput:
    """A policy loss and its diagnostics (the floats are detached scalars)."""

    pg_loss: torch.Tensor
    ppo_kl: float
    pg_clipfrac: float | None = None
    pg_clipfrac_lower: float | None = None

    def metrics(self) -> dict[str, float]:
        """verl's names: actor/pg_loss, actor/ppo_kl, and for PPO actor/pg_clipfrac(_lower)."""
        out = {"actor/pg_loss": float(self.pg_loss.detach().item()), "actor/ppo_kl": self.ppo_kl}
        if self.pg_clipfrac is not None:
            out["actor/pg_clipfrac"] = self.pg_clipfrac
        if self.pg_clipfrac_lower is not None:
            out["actor/pg_clipfrac_lower"] = self.pg_clipfrac_lower
        return out


def ppo_clip_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "token-mean",
    is_weights: torch.Tensor | None = None,
    denominator: float | None = None,
) -> PolicyLossOutput:
    """PPO-clip with asymmetric clip range and dual-clip, per-token IS weights applied before aggregation."""
    if clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be > 1 for dual-clip PPO, got {clip_ratio_c}")
    neg_kl = torch.clamp(log_prob - old_log_prob, min=-LOG_RATIO_CLAMP, max=LOG_RATIO_CLAMP)
    ratio = torch.exp(neg_kl)
    loss1 = -advantages * ratio
    loss2 = -advantages * torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    clipped = torch.maximum(loss1, loss2)
    loss3 = -advantages * clip_ratio_c
    dual = torch.minimum(loss3, clipped)
    negative = advantages < 0
    losses = torch.where(negative, dual, clipped)
    if is_weights is not None:
        losses = losses * is_weights.detach()
    with torch.no_grad():
        clipfrac = masked_mean(torch.gt(loss2, loss1).to(log_prob.dtype), mask).item()
        clipfrac_lower = masked_mean((torch.gt(clipped, loss3) & negative).to(log_prob.dtype), mask).item()
        ppo_kl = masked_mean(-neg_kl, mask).item()
    return PolicyLossOutput(
        pg_loss=agg_loss(losses, mask, loss_agg_mode, denominator),
        ppo_kl=ppo_kl,
        pg_clipfrac=clipfrac,
        pg_clipfrac_lower=clipfrac_lower,
    )


def reinforce_loss(
    log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    loss_agg_mode: str = "token-mean",
    is_weights: torch.Tensor | None = None,
    denominator: float | None = None,
) -> PolicyLossOutput:
    """REINFORCE with optional detached IS weights: L = agg(−A · log π_θ · w); no clipping."""
    losses = -advantages * log_prob
    if is_weights is not None:
        losses = losses * is_weights.detach()
    with torch.no_grad():
        ppo_kl = masked_mean(rollout_log_prob - log_prob, mask).item()
    return PolicyLossOutput(pg_loss=agg_loss(losses, mask, loss_agg_mode, denominator), ppo_kl=ppo_kl)
