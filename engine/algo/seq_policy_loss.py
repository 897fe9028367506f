"""Sequence-level policy losses, verl's `policy_loss.loss_mode = "gspo"` and `"geo_mean"` (`trainer.loss_mode`).

Notation: row i, token t, mask m, δ_t = log π_θ,t − log π_old,t, A_t the advantage, ε_low/ε_high the clip
range, w_t the optional (detached) rollout-correction IS weight, |y_i| = Σ_t m_it, sg[·] stop-gradient.

GSPO (`gspo_loss`, arXiv 2507.18071). Sequence ratio s_i = exp((1/|y_i|) Σ_t m·δ_t) (|y_i| clamped to ≥ 1);
the token-level combined ratio carries s_i's value and each token's own gradient:

    log s_it = min(sg[log s_i] + log π_θ,t − sg[log π_θ,t], 10)
    ℓ_t      = max(−A_t·s_it, −A_t·clip(s_it, 1 − ε_low, 1 + ε_high)) · w_t
    L        = Σ_{i non-empty} (Σ_t m·ℓ_t / Σ_t m) / D                  (seq-mean-token-mean)
    pg_clipfrac = masked_mean(1[clipped term > unclipped term]),  pg_clipfrac_lower = 0,
    ppo_kl      = masked_mean(−δ)

With a sequence-level A (GRPO) ∇L_i = −A_i·s_i·(1/|y_i|)·Σ_t ∇log π_θ,t inside the clip range — the paper's
sequence gradient. With one token per row GSPO is PPO-clip without dual-clip.

GMPO (`geo_mean_loss`, arXiv 2507.20673). Per token, δ clipped in log space on the side the sign of A selects:

    δ'_t = sgn(A_t)·min(sgn(A_t)·δ_t, sgn(A_t)·clamp(δ_t, −ε_low, ε_high))
    r_i  = exp(Σ_t m·δ'_t / (Σ_t m + 1e-8)),   Ā_i = Σ_t m·A_t / (Σ_t m + 1e-8)
    ℓ_i  = −Ā_i·r_i · exp(Σ_t m·log(w_t + 1e-10) / (Σ_t m + 1e-8))     (the IS weights' geometric mean)
    L    = Σ_{i non-empty} ℓ_i / D
    pg_clipfrac = masked_mean(1[δ ≠ clamp(δ)]·1[A > 0]),  pg_clipfrac_lower = masked_mean(1[δ ≠ clamp(δ)]·1[A < 0]),
    ppo_kl      = masked_mean(−δ)

D is the number of non-empty rows of `mask`, or `denominator` (the micro-batch's share of the mini-batch's
rows, see `engine.algo.loss`). verl takes `torch.mean` over all rows for GMPO; an empty row has ℓ_i = 0 there,
so the two differ only by whether empty rows count in D — asyncrl's seq-mean-token-mean counts non-empty rows,
which keeps micro-batch weighting exact. Masked positions never contribute, even when they hold NaN.
"""

from __future__ import annotations

import torch

from engine.algo.policy_loss import PolicyLossOutput, agg_loss
from engine.algo.stats import masked_mean, masked_sum, valid_rows

GSPO_LOG_RATIO_MAX = 10.0
SEQ_AGG = "seq-mean-token-mean"


def _clean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """x with masked positions set to 0 (padding log-probs may be garbage; keeps their gradient 0, not NaN)."""
    return torch.where(mask.bool(), x, torch.zeros_like(x))


def gspo_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    is_weights: torch.Tensor | None = None,
    denominator: float | None = None,
) -> PolicyLossOutput:
    """GSPO: token losses from the combined ratio s_it, aggregated seq-mean-token-mean (module docstring)."""
    lp = _clean(log_prob, mask)
    delta = lp - _clean(old_log_prob, mask)
    lengths = mask.to(lp.dtype).sum(dim=-1).clamp(min=1.0)
    log_seq = masked_sum(delta, mask, dim=-1) / lengths
    log_s = torch.clamp(log_seq.detach()[:, None] + lp - lp.detach(), max=GSPO_LOG_RATIO_MAX)
    ratio = torch.exp(log_s)
    adv = _clean(advantages, mask)
    loss1 = -adv * ratio
    loss2 = -adv * torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    losses = torch.maximum(loss1, loss2)
    if is_weights is not None:
        losses = losses * _clean(is_weights.detach(), mask)
    with torch.no_grad():
        clipfrac = masked_mean(torch.gt(loss2, loss1).to(lp.dtype), mask).item()
        ppo_kl = masked_mean(-delta, mask).item()
    return PolicyLossOutput(
        pg_loss=agg_loss(losses, mask, SEQ_AGG, denominator), ppo_kl=ppo_kl,
        pg_clipfrac=clipfrac, pg_clipfrac_lower=0.0,
    )


def geo_mean_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    is_weights: torch.Tensor | None = None,
    denominator: float | None = None,
) -> PolicyLossOutput:
    """GMPO: one loss per row from the geometric mean of its sign-clipped token ratios (module docstring)."""
    delta = _clean(log_prob, mask) - _clean(old_log_prob, mask)
    adv = _clean(advantages, mask)
    sgn = torch.sign(adv)
    clamped = torch.clamp(delta, -clip_ratio_low, clip_ratio_high)
    delta_c = sgn * torch.minimum(sgn * delta, sgn * clamped)
    row_ratio = torch.exp(masked_mean(delta_c, mask, dim=-1))
    row_adv = masked_mean(adv, mask, dim=-1)
    row_loss = -row_adv * row_ratio
    if is_weights is not None:
        w = _clean(is_weights.detach(), mask)
        row_loss = row_loss * torch.exp(masked_mean(torch.log(w + 1e-10), mask, dim=-1))
    rows = valid_rows(mask)
    denom = float(rows.sum().item()) if denominator is None else float(denominator)
    total = (row_loss * rows.to(row_loss.dtype)).sum()
    pg_loss = total / denom if denom > 0 else total * 0.0
    with torch.no_grad():
        clipped = torch.ne(delta, clamped)
        clipfrac = masked_mean((clipped & (adv > 0)).to(delta.dtype), mask).item()
        clipfrac_lower = masked_mean((clipped & (adv < 0)).to(delta.dtype), mask).item()
        ppo_kl = masked_mean(-delta, mask).item()
    return PolicyLossOutput(pg_loss=pg_loss, ppo_kl=ppo_kl, pg_clipfrac=clipfrac, pg_clipfrac_lower=clipfrac_lower)
