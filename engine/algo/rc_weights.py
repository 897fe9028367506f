"""Rollout-correction importance-sampling weights and their metrics (verl 0.9 `compute_rollout_correction_weights`).

Δ_t = log π_train(y_t) − log π_rollout(y_t), m the response mask, SB = 20:

    token    : w_t = exp(clamp(Δ_t, −SB, SB)) · m_t
    sequence : S = Σ_t Δ_t m_t  (unclamped sum),  w_t = exp(clamp(S, −SB, SB)) · m_t  (constant along the row)
    TIS      (threshold C)       : w ← min(w, C)                 (no lower truncation)
    IcePop   (threshold "lo_hi") : w ← w · 1[lo ≤ w ≤ hi]        (on the raw weight; the mask is unchanged)
    batch_normalize: token    w ← w / masked_mean_all(w)
                     sequence w ← w / mean_{non-empty rows}(masked_mean_row(w))
                     (skipped when the mean ≤ 1e-8; all-reduced over ranks when torch.distributed is initialised,
                     so every rank must then make the same calls)

The weights are detached. Metrics (unprefixed names, verl's) are computed before batch normalisation; where
verl averages per-row statistics over all rows, rows without a valid token are left out here (identical when
every row has a token).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from engine.config.rc_config import parse_is_threshold
from engine.algo.stats import (
    clamped_masked_std,
    masked_max,
    masked_mean,
    masked_min,
    masked_sum,
    row_stats,
    valid_rows,
)

SAFETY_BOUND = 20.0


def compute_is_weights(
    log_ratio: torch.Tensor,
    mask: torch.Tensor,
    level: str,
    threshold: float | str,
    batch_normalize: bool = False,
) -> tuple[torch.Tensor, dict[str, float]]:
    """(weights [B, R], metrics) for IS `level` in {"token", "sequence"} (formulas in the module docstring)."""
    upper, lower = parse_is_threshold(threshold)
    m = mask.to(log_ratio.dtype)
    if level == "token":
        raw = torch.exp(torch.clamp(log_ratio, -SAFETY_BOUND, SAFETY_BOUND)) * m
        seq_log = None
    elif level == "sequence":
        seq_log = masked_sum(log_ratio, mask, dim=-1)
        raw = torch.exp(torch.clamp(seq_log, -SAFETY_BOUND, SAFETY_BOUND))[:, None].expand_as(log_ratio) * m
    else:
        raise ValueError(f"invalid rollout_is {level!r}; expected 'token' or 'sequence'")
    if lower is None:
        weights = raw.clamp(max=upper)
    else:
        weights = torch.where((raw >= lower) & (raw <= upper), raw, torch.zeros_like(raw))
    metrics = is_metrics(weights, raw, seq_log, mask, upper, lower)
    if lower is not None:
        metrics["rollout_is_oob_ratio"] = masked_mean(((raw < lower) | (raw > upper)).to(raw.dtype), mask).item()
    weights = weights.detach()
    if batch_normalize:
        mean = _batch_mean(weights, mask, level)
        if mean > 1e-8:
            weights = weights / mean
            metrics["rollout_is_batch_norm_factor"] = mean
        else:
            metrics["rollout_is_batch_norm_factor"] = 1.0
    return weights, metrics


def _batch_mean(weights: torch.Tensor, mask: torch.Tensor, level: str) -> float:
    """Token: masked mean over all tokens. Sequence: mean over non-empty rows of the row means."""
    if level == "token":
        num, den = masked_sum(weights, mask), mask.to(weights.dtype).sum()
    else:
        rows = valid_rows(mask).to(weights.dtype)
        num, den = (masked_mean(weights, mask, dim=-1) * rows).sum(), rows.sum()
    if dist.is_available() and dist.is_initialized():
        from engine.trainer.process_groups import reduce_dtype

        both = torch.stack([num, den]).to(reduce_dtype(num.device.type))  # float64 where the backend reduces it
        dist.all_reduce(both)
        num, den = both[0], both[1]
    if level == "token":
        return (num / (den + 1e-8)).item()
    return (num / den.clamp_min(1e-8)).item()


def is_metrics(
    weights: torch.Tensor,
    raw: torch.Tensor,
    seq_log: torch.Tensor | None,
    mask: torch.Tensor,
    upper: float,
    lower: float | None,
) -> dict[str, float]:
    """IS diagnostics: mean/max/min, fractions beyond the bounds, std, ESS and per-sequence statistics.

    lower defaults to 1/upper. Token level: max/min of the applied weights, fractions of raw token weights
    > upper / < lower. Sequence level: max = exp(min(max_row S, SB)), min = exp(min_row S), fractions of rows
    with S > log upper / S < log lower. std = population std of clamp(w, 0, upper); ESS = 1 / masked_mean(
    (w_c / (masked_mean(w_c) + 1e-8))²) with w_c = clamp(w, 0, upper) — a fraction in (0, 1] (0 if all w are 0).
    """
    lo = 1.0 / upper if lower is None else lower
    rows = valid_rows(mask)
    out: dict[str, float] = {"rollout_is_mean": masked_mean(weights, mask).item()}
    if seq_log is not None:
        s = seq_log[rows]
        log_hi = torch.log(torch.tensor(upper, dtype=s.dtype))
        log_lo = torch.log(torch.tensor(lo, dtype=s.dtype))
        out["rollout_is_max"] = torch.exp(torch.clamp(s.max(), max=SAFETY_BOUND)).item()
        out["rollout_is_min"] = torch.exp(s.min()).item()
        out["rollout_is_ratio_fraction_high"] = (s > log_hi).float().mean().item()
        out["rollout_is_ratio_fraction_low"] = (s < log_lo).float().mean().item()
    else:
        out["rollout_is_ratio_fraction_high"] = masked_mean((raw > upper).to(raw.dtype), mask).item()
        out["rollout_is_ratio_fraction_low"] = masked_mean((raw < lo).to(raw.dtype), mask).item()
        out["rollout_is_max"] = masked_max(weights, mask)
        out["rollout_is_min"] = masked_min(weights, mask)
    out["rollout_is_std"] = clamped_masked_std(weights, mask, 0.0, upper)
    w_c = weights.clamp(min=0.0, max=upper)
    normalized = w_c / (masked_mean(w_c, mask) + 1e-8)
    second = masked_mean(normalized.square(), mask).item()
    out["rollout_is_eff_sample_size"] = 1.0 / second if second > 0 else 0.0
    row_w = masked_mean(weights, mask, dim=-1)[rows]
    row_raw = masked_mean(raw, mask, dim=-1)[rows]
    mean, std, mx, mn = row_stats(row_w)
    out.update({
        "rollout_is_seq_mean": mean, "rollout_is_seq_std": std,
        "rollout_is_seq_max": mx, "rollout_is_seq_min": mn,
        "rollout_is_seq_max_deviation": (row_w - 1.0).abs().max().item(),
        "rollout_is_seq_fraction_high": (row_raw > upper).float().mean().item(),
        "rollout_is_seq_fraction_low": (row_raw < lo).float().mean().item(),
    })
    return out
