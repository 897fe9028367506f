"""Per-token KL estimators between the policy and a reference, and the entropy of a categorical.

With Δ = log π_θ(y_t) − log π_ref(y_t) (Schulman, "Approximating KL divergence", 2020):

    k1 / "kl"                : Δ                                   (unbiased for KL(π_θ‖π_ref), can be negative)
    "abs"                    : |Δ|
    k2 / "mse"               : ½ Δ²
    k3 / "low_var_kl"        : clamp(exp(−Δ') − 1 + Δ', −10, 10),  Δ' = clamp(Δ, −20, 20)
                               i.e. ratio − log ratio − 1 with ratio = π_ref/π_θ; non-negative, low variance

The clamps are verl's (`kl_penalty_forward`). Entropy of logits z over the vocabulary:

    H = logsumexp(z) − Σ_v softmax(z)_v · z_v
"""

from __future__ import annotations

import torch

KL_KINDS = ("k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl")


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL estimate (same shape as the inputs); `kind` in KL_KINDS (formulas in the module docstring)."""
    if logp.shape != ref_logp.shape:
        raise ValueError(f"logp {tuple(logp.shape)} and ref_logp {tuple(ref_logp.shape)} differ in shape")
    delta = logp - ref_logp
    if kind in ("k1", "kl"):
        return delta
    if kind == "abs":
        return delta.abs()
    if kind in ("k2", "mse"):
        return 0.5 * delta.square()
    if kind in ("k3", "low_var_kl"):
        neg = torch.clamp(-delta, min=-20.0, max=20.0)  # log(π_ref/π_θ)
        return torch.clamp(torch.exp(neg) - neg - 1.0, min=-10.0, max=10.0)
    raise ValueError(f"unknown KL estimator {kind!r}; expected one of {KL_KINDS}")


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy over the last dimension: H = logsumexp(z) − Σ softmax(z)·z; shape `logits.shape[:-1]`."""
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)
