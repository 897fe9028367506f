"""The trainer's optimizer (AdamW) and its learning-rate schedule (linear warmup, then constant).

    lr(t) = lr_base · min(1, (t + 1) / warmup_steps)     for optimizer step t = 0, 1, …   (warmup_steps > 0)
    lr(t) = lr_base                                        otherwise
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 1e-6
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 0.01
    eps: float = 1e-8
    warmup_steps: int = 0

    @staticmethod
    def from_dict(cfg: Mapping[str, Any]) -> OptimConfig:
        known = {"lr", "betas", "weight_decay", "eps", "warmup_steps"}
        unknown = set(cfg) - known
        if unknown:
            raise ValueError(f"unknown optimizer settings: {sorted(unknown)}")
        kw = dict(cfg)
        if "betas" in kw:
            kw["betas"] = tuple(float(b) for b in kw["betas"])
        return OptimConfig(**kw)


def build_optimizer(params: Iterable[torch.nn.Parameter], cfg: OptimConfig) -> torch.optim.AdamW:
    """AdamW over the trainable parameters (foreach kernels; works on DTensor shards too)."""
    return torch.optim.AdamW(
        [p for p in params if p.requires_grad], lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay, eps=cfg.eps
    )


def warmup_lr(base_lr: float, step: int, warmup_steps: int) -> float:
    """The learning rate of optimizer step `step` (0-based) — see the module docstring."""
    if warmup_steps <= 0:
        return base_lr
    return base_lr * min(1.0, (step + 1) / warmup_steps)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


class WarmupSchedule:
    """`set_lr` / `current_lr` of a trainer backend, lr(t) of the module docstring at its `global_step`; the
    backend sets `base_lr`, `global_step` and `warmup_steps`."""

    base_lr: float
    global_step: int
    warmup_steps: int

    def set_lr(self, lr: float) -> None:
        """Change the base learning rate (the warmup factor still applies) from the next step on."""
        if not lr > 0:
            raise ValueError("lr must be > 0")
        self.base_lr = float(lr)

    def current_lr(self) -> float:
        return warmup_lr(self.base_lr, self.global_step, self.warmup_steps)
