"""Rollout correction (importance sampling + rejection sampling) with verl 0.9 semantics and metric names.

Entry point `compute_rollout_correction(old_log_prob, rollout_log_prob, response_mask, ...)`:

    Δ = old_log_prob − rollout_log_prob = log(π_train / π_rollout)

π_train is π_prox (= `old_log_probs`) in decoupled mode and the current π_θ in bypass mode. The IS weight
estimates π_train/π_rollout (`rc_weights`: token or sequence level, TIS clamp or IcePop band, optional batch
normalisation); rejection sampling (`rc_rejection`) zeroes tokens/rows of the mask whose k1/k2/k3 divergence
leaves its bounds; off-policy diagnostics (`rc_diagnostics`) always use the original mask.

**k1 orientation (as verl really does it).** verl's k1 statistic is −Δ = log(π_rollout/π_train), so a k1
threshold "lo_hi" bounds the ratio **π_rollout/π_train** — not π_train/π_rollout as verl's math doc suggests:
`token_k1` keeps lo ≤ π_rollout/π_train ≤ hi, `seq_sum_k1` keeps lo ≤ Π_t π_rollout/π_train ≤ hi, and
`seq_mean_k1` ("Geo-RS") keeps rows whose geometric mean of π_train/π_rollout lies in [1/hi, 1/lo]. For
reciprocal-symmetric bounds ("0.5_2.0", "0.999_1.001", or a single float u = "1/u_u") both orientations agree;
for asymmetric ones ("0.9_1.6") they do not — e.g. a row with geo-mean π_train/π_rollout = 0.8 is *kept* by
"0.9_1.6" (1/1.6 = 0.625 ≤ 0.8 ≤ 1/0.9). We reproduce verl's orientation so migrated configs behave the same.

Beyond verl: NaN/inf log-probs at valid positions raise ValueError naming the rows; bf16/fp16 inputs are
computed in float32; per-row statistics skip rows without a valid token. The histograms, the mismatch alarm and
the off-policy metrics are `engine.algo.rc_diagnostics`'.
"""

from __future__ import annotations

import torch

from engine.config.rc_config import check_is_level, parse_rs_options, parse_rs_thresholds
from engine.algo.rc_diagnostics import offpolicy_metrics
from engine.algo.rc_rejection import compute_rs_mask
from engine.algo.rc_weights import compute_is_weights

__all__ = ["check_log_probs", "compute_rollout_correction"]

PREFIX = "rollout_corr/"


def check_log_probs(name: str, log_prob: torch.Tensor, mask: torch.Tensor) -> None:
    """ValueError naming the sample rows where `log_prob` is NaN/inf at a valid (mask = 1) position."""
    bad = ~torch.isfinite(log_prob) & mask.bool()
    if bad.any():
        rows = torch.nonzero(bad.any(dim=-1)).flatten().tolist()
        row, tok = (int(v) for v in torch.nonzero(bad)[0].tolist())
        shown = rows[:10] + (["..."] if len(rows) > 10 else [])
        raise ValueError(
            f"{name} has NaN/inf at valid response positions in sample rows {shown} "
            f"(first: row {row}, token {tok}, value {log_prob[row, tok].item()})"
        )


def _check_inputs(old: torch.Tensor, rollout: torch.Tensor, mask: torch.Tensor) -> None:
    if old.dim() != 2:
        raise ValueError(f"log-probs must be [batch, response_len], got old_log_prob shape {tuple(old.shape)}")
    if old.shape != rollout.shape:
        raise ValueError(f"old_log_prob shape {tuple(old.shape)} != rollout_log_prob shape {tuple(rollout.shape)}")
    if old.shape != mask.shape:
        raise ValueError(f"log-prob shape {tuple(old.shape)} != response_mask shape {tuple(mask.shape)}")
    if not mask.bool().any():
        raise ValueError("response_mask must contain at least one valid token (1)")
    check_log_probs("old_log_prob", old, mask)
    check_log_probs("rollout_log_prob", rollout, mask)


def compute_rollout_correction(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    rollout_is: str | None = None,
    rollout_is_threshold: float | str | None = 2.0,
    rollout_is_batch_normalize: bool = False,
    rollout_rs: str | None = None,
    rollout_rs_threshold: float | str | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor, dict[str, float]]:
    """IS weights, RS-modified mask and `rollout_corr/*` metrics for tensors `[batch, response_len]`.

    Returns `(is_weights or None, modified_response_mask, metrics)`: weights are detached, zero on padding and
    None when `rollout_is` is None; the mask keeps `response_mask`'s dtype and equals it when `rollout_rs` is
    None; metrics map verl's names (`rollout_corr/rollout_is_mean`, `rollout_corr/kl`, ...) to floats.
    Raises ValueError for shape mismatches, an all-zero mask, NaN/inf log-probs, bad or legacy options.
    """
    _check_inputs(old_log_prob, rollout_log_prob, response_mask)
    thresholds = None
    if rollout_rs is not None:
        thresholds = parse_rs_thresholds(parse_rs_options(rollout_rs), rollout_rs_threshold)
    if rollout_is is not None:
        check_is_level(rollout_is)
        if rollout_is_threshold is None:
            raise ValueError("rollout_is is set but rollout_is_threshold is None")
    work_dtype = torch.promote_types(old_log_prob.dtype, torch.float32)
    old = old_log_prob.detach().to(work_dtype)
    rollout = rollout_log_prob.detach().to(work_dtype)
    log_ratio = old - rollout
    metrics: dict[str, float] = {}
    weights = None
    if rollout_is is not None:
        weights, is_m = compute_is_weights(
            log_ratio, response_mask, rollout_is, rollout_is_threshold, rollout_is_batch_normalize
        )
        metrics.update(is_m)
    new_mask = response_mask.clone()
    if thresholds is not None:
        new_mask, rs_m = compute_rs_mask(log_ratio, response_mask, thresholds)
        metrics.update(rs_m)
    metrics.update(offpolicy_metrics(old, rollout, response_mask))
    return weights, new_mask, {f"{PREFIX}{k}": float(v) for k, v in metrics.items()}
