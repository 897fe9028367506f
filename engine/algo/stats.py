"""Masked reductions shared by the algorithm modules.

All helpers take a value tensor and a 0/1 (float or bool) mask of the same shape. Positions where the mask is 0
never contribute, even when they hold NaN/inf (padding log-probs are often garbage): values are replaced with 0
there before multiplying, exactly like verl's `masked_sum`.

    masked_sum(x, m)  = Σ x·m
    masked_mean(x, m) = Σ x·m / (Σ m + 1e-8)        (the 1e-8 is verl's; an empty mask gives 0)
"""

from __future__ import annotations

import torch

MEAN_EPS = 1e-8


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Σ values·mask over `dim` (all elements when None); masked-out NaN/inf are ignored."""
    valid = torch.where(mask.bool(), values, torch.zeros_like(values))
    prod = valid * mask.to(values.dtype)
    return prod.sum() if dim is None else prod.sum(dim=dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Σ values·mask / (Σ mask + 1e-8) over `dim` (all elements when None)."""
    m = mask.to(values.dtype)
    denom = m.sum() if dim is None else m.sum(dim=dim)
    return masked_sum(values, mask, dim) / (denom + MEAN_EPS)


def valid_rows(mask: torch.Tensor) -> torch.Tensor:
    """Bool [B]: rows with at least one valid token."""
    return mask.sum(dim=-1) > 0


def masked_max(values: torch.Tensor, mask: torch.Tensor) -> float:
    """Largest value over valid positions (-inf when the mask is empty)."""
    return values.masked_fill(~mask.bool(), float("-inf")).max().item()


def masked_min(values: torch.Tensor, mask: torch.Tensor) -> float:
    """Smallest value over valid positions (+inf when the mask is empty)."""
    return values.masked_fill(~mask.bool(), float("inf")).min().item()


def clamped_masked_std(values: torch.Tensor, mask: torch.Tensor, low: float, high: float) -> float:
    """Population std of clamp(values, low, high) over valid tokens:
    sqrt(max(0, masked_mean(v²) − masked_mean(v)²)); 0 when fewer than two valid tokens."""
    if mask.sum() <= 1:
        return 0.0
    v = values.clamp(min=low, max=high)
    mean = masked_mean(v, mask)
    var = masked_mean(v.square(), mask) - mean.square()
    return torch.sqrt(torch.clamp(var, min=0.0)).item()


def row_stats(values: torch.Tensor) -> tuple[float, float, float, float]:
    """(mean, unbiased std — 0 for a single value —, max, min) of a 1-D tensor, which must not be empty."""
    std = values.std().item() if values.numel() > 1 else 0.0
    return values.mean().item(), std, values.max().item(), values.min().item()
