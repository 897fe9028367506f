"""Train–inference mismatch diagnostics (verl 0.9 `compute_offpolicy_metrics`), histograms and the mismatch alarm.

Δ = log π_train − log π_rollout, m the mask, row means over valid tokens, "mean_seq" over rows with at least one
valid token (verl averages over all rows, counting an empty row as ppl 1 / diff 0):

    training_ppl     = mean_seq exp(−masked_mean_row(log π_train))     training_log_ppl = mean_seq(−masked_mean_row(.))
    rollout_ppl, rollout_log_ppl: the same for π_rollout
    kl               = masked_mean_all(log π_rollout − log π_train)    (K1 estimate of KL(π_rollout‖π_train); can be < 0)
    k3_kl            = masked_mean_all(exp(Δ) − Δ − 1)                (unclamped)
    log_ppl_diff_row = masked_mean_row(log π_rollout) − masked_mean_row(log π_train)
    log_ppl_diff / log_ppl_abs_diff / log_ppl_diff_max / log_ppl_diff_min: mean, mean |.|, max, min over rows
    ppl_ratio        = mean_seq exp(log_ppl_diff_row)                   (training_ppl / rollout_ppl per row)
    chi2_token       = masked_mean_all(exp(clamp(Δ, ±20))²) − 1
    chi2_seq         = mean_seq exp(2·clamp(Σ_t Δ_t m_t, ±20)) − 1
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import torch

from engine.algo.rc_weights import SAFETY_BOUND
from engine.algo.stats import masked_mean, masked_sum, valid_rows


def offpolicy_metrics(train_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Unprefixed mismatch metrics (formulas in the module docstring); the mask must have a valid token."""
    rows = valid_rows(mask)
    train_row = masked_mean(train_log_prob, mask, dim=-1)[rows]
    roll_row = masked_mean(rollout_log_prob, mask, dim=-1)[rows]
    delta = train_log_prob - rollout_log_prob
    diff = roll_row - train_row
    seq_sum = torch.clamp(masked_sum(delta, mask, dim=-1)[rows], -SAFETY_BOUND, SAFETY_BOUND)
    rho = torch.exp(torch.clamp(delta, -SAFETY_BOUND, SAFETY_BOUND))
    return {
        "training_ppl": torch.exp(-train_row).mean().item(),
        "training_log_ppl": (-train_row).mean().item(),
        "kl": masked_mean(rollout_log_prob - train_log_prob, mask).item(),
        "k3_kl": masked_mean(torch.exp(delta) - delta - 1.0, mask).item(),
        "rollout_ppl": torch.exp(-roll_row).mean().item(),
        "rollout_log_ppl": (-roll_row).mean().item(),
        "log_ppl_diff": diff.mean().item(),
        "log_ppl_abs_diff": diff.abs().mean().item(),
        "log_ppl_diff_max": diff.max().item(),
        "log_ppl_diff_min": diff.min().item(),
        "ppl_ratio": torch.exp(diff).mean().item(),
        "chi2_token": (masked_mean(rho.square(), mask) - 1.0).item(),
        "chi2_seq": (torch.exp(2.0 * seq_sum).mean() - 1.0).item(),
    }


def is_weight_histogram(
    weights: torch.Tensor, mask: torch.Tensor, bins: int = 24, low: float = 1e-3, high: float = 1e3
) -> dict[str, list[float]]:
    """Histogram of the IS weights of valid tokens over `bins` log-spaced bins spanning [low, high].

    Edges are fixed (comparable across steps); a weight below `low` (zeros from IcePop included) counts in the
    first bin and one above `high` in the last. Returns {"edges": bins + 1 floats, "counts": bins floats}.
    """
    if bins < 1 or not 0 < low < high:
        raise ValueError(f"need bins >= 1 and 0 < low < high, got bins={bins}, low={low}, high={high}")
    edges = torch.logspace(math.log10(low), math.log10(high), bins + 1, dtype=torch.float64)
    w = weights.detach().to(torch.float64)[mask.bool()]
    w = w[~torch.isnan(w)]
    idx = torch.bucketize(w, edges, right=True) - 1
    counts = torch.bincount(idx.clamp(0, bins - 1), minlength=bins)
    return {"edges": edges.tolist(), "counts": [float(c) for c in counts.tolist()]}


def staleness_histogram(staleness: Iterable[int]) -> dict[str, list[float]]:
    """Counts of trajectories per integer staleness s = 0..max: edges [0, 1, .., max+1], counts[s] = #{= s}."""
    values = [int(s) for s in staleness]
    if any(s < 0 for s in values):
        raise ValueError("staleness values must be >= 0")
    top = max(values, default=0)
    counts = [0.0] * (top + 1)
    for s in values:
        counts[s] += 1.0
    return {"edges": [float(e) for e in range(top + 2)], "counts": counts}


def _get(metrics: Mapping[str, float], name: str) -> float | None:
    for key in (f"rollout_corr/{name}", name):
        if key in metrics:
            return float(metrics[key])
    return None


def mismatch_alarm(
    metrics: Mapping[str, float], kl_bound: float, ppl_ratio_bound: float, chi2_bound: float
) -> list[str]:
    """Human-readable warnings when the train–inference mismatch leaves its bounds:
    |kl| > kl_bound, ppl_ratio ∉ [1/ppl_ratio_bound, ppl_ratio_bound], chi2_token > chi2_bound (NaN always alarms).
    Accepts `rollout_corr/`-prefixed or bare names; missing metrics are skipped."""
    alarms: list[str] = []
    kl = _get(metrics, "kl")
    if kl is not None and not abs(kl) <= kl_bound:
        alarms.append(f"train-inference mismatch: |kl| = {abs(kl):.4g} exceeds {kl_bound:g} "
                      "(rollout and trainer log-probs of the same tokens disagree)")
    ratio = _get(metrics, "ppl_ratio")
    if ratio is not None and not 1.0 / ppl_ratio_bound <= ratio <= ppl_ratio_bound:
        alarms.append(f"train-inference mismatch: ppl_ratio = {ratio:.4g} outside "
                      f"[{1.0 / ppl_ratio_bound:.4g}, {ppl_ratio_bound:g}] (training vs rollout perplexity)")
    chi2 = _get(metrics, "chi2_token")
    if chi2 is not None and not chi2 <= chi2_bound:
        alarms.append(f"train-inference mismatch: chi2_token = {chi2:.4g} exceeds {chi2_bound:g} "
                      "(IS weights have high variance)")
    return alarms
