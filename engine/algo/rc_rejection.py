"""Rollout-correction rejection sampling (verl 0.9 `compute_rollout_rejection_mask`).

With Δ̂ = clamp(log π_train − log π_rollout, −20, 20) per token:

    k1 = −Δ̂ = log(π_rollout/π_train),   k2 = ½ Δ̂²,   k3 = exp(Δ̂) − 1 − Δ̂

    token_kX    : the per-token statistic, decision per token
    seq_sum_kX  : Σ_t m·kX          seq_mean_kX : Σ_t m·kX / Σ_t m          seq_max_kX : max over valid tokens
                  (0 for an empty row); sequence options broadcast their decision to every token of the row
    keep (k1)    : log lo ≤ stat ≤ log hi      — i.e. lo ≤ π_rollout/π_train ≤ hi (per token, product or
                   geometric mean). This is the orientation verl really uses: `seq_mean_k1` with "lo_hi" keeps
                   rows whose geometric mean of π_train/π_rollout lies in [1/hi, 1/lo].
    keep (k2/k3) : stat ≤ hi

Options combine by AND: modified_mask = response_mask · Π_options keep. The mask only ever removes tokens.
Per-option metrics follow verl's `compute_rs_metrics`; the global `rollout_rs_seq_masked_fraction` is taken over
rows with at least one valid token (verl divides by all rows).
"""

from __future__ import annotations

import torch

from engine.config.rc_config import RSThreshold, k1_log_bounds
from engine.algo.rc_weights import SAFETY_BOUND
from engine.algo.stats import (
    clamped_masked_std,
    masked_max,
    masked_mean,
    masked_min,
    masked_sum,
    row_stats,
    valid_rows,
)


def token_divergences(log_ratio: torch.Tensor) -> dict[str, torch.Tensor]:
    """{"k1", "k2", "k3"} per-token statistics of the clamped log-ratio (module docstring)."""
    d = torch.clamp(log_ratio, -SAFETY_BOUND, SAFETY_BOUND)
    return {"k1": -d, "k2": 0.5 * d.square(), "k3": torch.exp(d) - 1.0 - d}


def _row_max(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    filled = values.masked_fill(~mask.bool(), float("-inf")).max(dim=-1).values
    return torch.where(torch.isinf(filled) & (filled < 0), torch.zeros_like(filled), filled)


def compute_rs_mask(
    log_ratio: torch.Tensor, mask: torch.Tensor, thresholds: list[RSThreshold]
) -> tuple[torch.Tensor, dict[str, float]]:
    """(modified mask [B, R] in mask's dtype, unprefixed metrics) for the AND of `thresholds`' options."""
    if log_ratio.shape[0] == 0:
        return mask, {}
    stats = token_divergences(log_ratio)
    mask_bool = mask.bool()
    rows = valid_rows(mask)
    combined = torch.ones_like(log_ratio)
    metrics: dict[str, float] = {}
    for th in thresholds:
        kind = th.option.rsplit("_", 1)[1]
        tok = stats[kind]
        if th.level == "token":
            per_token, per_seq = tok, None
        else:
            agg = th.option.split("_")[1]
            if agg == "sum":
                per_seq = masked_sum(tok, mask, dim=-1)
            elif agg == "mean":
                per_seq = masked_mean(tok, mask, dim=-1)
            else:
                per_seq = _row_max(tok, mask)
            per_token = per_seq[:, None].expand_as(log_ratio)
        if th.is_k1:
            log_lo, log_hi = k1_log_bounds(th)
            keep = (per_token >= log_lo) & (per_token <= log_hi)
            metric_hi, metric_lo = log_hi, log_lo
        else:
            keep = per_token <= th.upper
            metric_hi, metric_lo = th.upper, 0.0
        keep_f = keep.to(log_ratio.dtype)
        combined = combined * keep_f
        metrics.update(rs_option_metrics(th, per_token, per_seq, mask, metric_hi, metric_lo))
        row_kept = ~((~keep) & mask_bool).any(dim=-1)
        prefix = f"rollout_rs_{th.option}"
        metrics[f"{prefix}_masked_fraction"] = masked_mean(1.0 - keep_f, mask).item()
        n_rows = rows.sum().item()
        metrics[f"{prefix}_seq_masked_fraction"] = ((~row_kept) & rows).sum().item() / n_rows if n_rows else 0.0
    metrics["rollout_rs_masked_fraction"] = masked_mean(1.0 - combined, mask).item()
    rejected_rows = ((combined <= 0.5) & mask_bool).any(dim=-1)
    n_rows = rows.sum().item()
    metrics["rollout_rs_seq_masked_fraction"] = (rejected_rows & rows).sum().item() / n_rows if n_rows else 0.0
    return (mask * combined).to(mask.dtype), metrics


def rs_option_metrics(
    th: RSThreshold,
    per_token: torch.Tensor,
    per_seq: torch.Tensor | None,
    mask: torch.Tensor,
    upper: float,
    lower: float,
) -> dict[str, float]:
    """Statistics of one RS option (`upper`/`lower` in statistic space: log-bounds for k1, `lower`=0 otherwise).

    mean: masked mean of the per-token (broadcast) statistic; max/min and fraction_high/low over valid rows for
    sequence options, over valid tokens for token options (fraction_low is 0 unless k1); std of the statistic
    clamped to [lower, upper]; seq_* over the per-row values (row mean of the token statistic for token options).
    """
    p = f"rollout_rs_{th.option}"
    rows = valid_rows(mask)
    seq_vals = (per_seq if per_seq is not None else masked_mean(per_token, mask, dim=-1))[rows]
    out: dict[str, float] = {f"{p}_mean": masked_mean(per_token, mask).item()}
    if th.level == "sequence" and seq_vals.numel() > 0:
        out[f"{p}_max"], out[f"{p}_min"] = seq_vals.max().item(), seq_vals.min().item()
        out[f"{p}_fraction_high"] = (seq_vals > upper).float().mean().item()
        out[f"{p}_fraction_low"] = (seq_vals < lower).float().mean().item() if th.is_k1 else 0.0
    else:
        out[f"{p}_max"], out[f"{p}_min"] = masked_max(per_token, mask), masked_min(per_token, mask)
        out[f"{p}_fraction_high"] = masked_mean((per_token > upper).to(per_token.dtype), mask).item()
        low = masked_mean((per_token < lower).to(per_token.dtype), mask).item()
        out[f"{p}_fraction_low"] = low if th.is_k1 else 0.0
    out[f"{p}_std"] = clamped_masked_std(per_token, mask, lower if th.is_k1 else 0.0, upper)
    if seq_vals.numel() > 0:
        mean, std, mx, mn = row_stats(seq_vals)
        out.update({
            f"{p}_seq_mean": mean, f"{p}_seq_std": std, f"{p}_seq_max": mx, f"{p}_seq_min": mn,
            f"{p}_seq_max_deviation": seq_vals.abs().max().item(),
            f"{p}_seq_fraction_high": (seq_vals > upper).float().mean().item(),
        })
        if th.is_k1:
            out[f"{p}_seq_fraction_low"] = (seq_vals < lower).float().mean().item()
    else:
        for key in ("seq_mean", "seq_std", "seq_max", "seq_min", "seq_max_deviation", "seq_fraction_high",
                    "seq_fraction_low"):
            out[f"{p}_{key}"] = 0.0
    return out
