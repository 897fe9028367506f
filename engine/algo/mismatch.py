"""Numeric train–inference mismatch, told apart from policy drift.

The gap between the rollout's log-probs and the trainer's has two causes: *numeric mismatch* (the same
weights give different probabilities in the two engines: bf16 vs fp32 kernels, a sampler bug) and *policy
drift* (the trainer's weights have moved since the tokens were sampled: staleness, earlier optimizer steps).
Only the first is a fault; the second is what rollout correction (`rollout_corr/*`) corrects. A comparison
measures mismatch only on rows whose trainer log-probs were computed **at the weights that generated them**:

* decoupled mode: π_prox (the snapshot taken at the last sync, version V) vs π_rollout on the rows generated
  entirely at V (`min_version == max_version == V`);
* bypass mode: the first forward of a row, before any optimizer step since the sync, vs π_rollout on rows
  generated entirely at V — the trainer has not moved since the sync, and the row was not yet trained on.

`same_weight_rows` picks those rows; `mismatch_report` computes, with Δ = log π_train − log π_rollout over the
valid tokens of a row set S,

    kl         = mean_{t ∈ S} (log π_rollout − log π_train)                       (K1 of KL(π_rollout‖π_train))
    ppl_ratio  = mean_{rows ∈ S} exp(mean_t log π_rollout − mean_t log π_train)
    chi2_token = mean_{t ∈ S} exp(2 clamp(Δ, ±20)) − 1

on S = the same-weight rows (`asyncrl/mismatch/kl`, `/ppl_ratio`, `/chi2_token`, `/rows`) and the K1 `kl` on the
other rows (`asyncrl/mismatch/drift_kl`, `/drift_rows`), and raises the alarm (`mismatch_alarm`'s bounds) on the
numeric set only: drift never alarms. With no same-weight row in the step there is no numeric value and no alarm.
"""

from __future__ import annotations

from typing import Any

import torch

from engine.algo.rc_diagnostics import mismatch_alarm, offpolicy_metrics
from engine.algo.stats import masked_mean

PREFIX = "asyncrl/mismatch/"


def same_weight_rows(min_versions: torch.Tensor, max_versions: torch.Tensor, version: int,
                     fresh: torch.Tensor | None = None) -> torch.Tensor:
    """Rows generated entirely at `version` (and, when `fresh` [B] is given, whose trainer log-probs were
    computed before the weights moved): bool [B]."""
    rows = (min_versions == version) & (max_versions == version)
    return rows & fresh.bool() if fresh is not None else rows


def mismatch_report(train_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, mask: torch.Tensor,
                    same_weights: torch.Tensor, *, kl_bound: float, ppl_ratio_bound: float,
                    chi2_bound: float) -> tuple[dict[str, Any], list[str]]:
    """`asyncrl/mismatch/*` metrics and the alarm messages (see the module docstring) for tensors [B, R],
    `same_weights` bool [B]. Rows of `mask` without a valid token are ignored."""
    mask = mask.float()
    train = train_log_probs.detach().float()
    rollout = rollout_log_probs.detach().float()
    has_tokens = mask.sum(-1) > 0
    numeric = same_weights.bool() & has_tokens
    drift = ~same_weights.bool() & has_tokens
    out: dict[str, Any] = {f"{PREFIX}rows": int(numeric.sum()), f"{PREFIX}drift_rows": int(drift.sum())}
    alarms: list[str] = []
    if numeric.any():
        m = offpolicy_metrics(train[numeric], rollout[numeric], mask[numeric])
        numeric_metrics = {name: m[name] for name in ("kl", "ppl_ratio", "chi2_token")}
        out.update({f"{PREFIX}{k}": v for k, v in numeric_metrics.items()})
        alarms = mismatch_alarm(numeric_metrics, kl_bound, ppl_ratio_bound, chi2_bound)
    if drift.any():
        out[f"{PREFIX}drift_kl"] = masked_mean(rollout[drift] - train[drift], mask[drift]).item()
    return out, alarms
