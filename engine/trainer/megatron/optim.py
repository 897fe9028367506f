"""Optimizers for the Megatron backend.

CPU: Megatron's optimizer needs CUDA, so `MainGradAdamW` runs `torch.optim.AdamW` on the gradients that
Megatron DDP accumulates in each parameter's `main_grad` (already averaged over data parallel by
`finalize_model_grads`). Weight decay is applied to matrices only (ndim ≥ 2), Megatron's default.

Gradient norm across model parallelism — each gradient element counted exactly once:

    ‖g‖² = Σ_TP×PP-group Σ_{dense p: TP-sharded or tp_rank = 0} ‖g_p‖²
         + Σ_EP×ETP×PP-group Σ_{expert p: ETP-sharded or etp_rank = 0} ‖g_p‖²

A parameter marked `shared` (the last pipeline stage's copy of a tied embedding, whose gradient equals the
first stage's after Megatron's embedding all-reduce) is left out, as Megatron's `param_is_not_shared` does.

then clipping scales every gradient by c = min(1, max_norm / (‖g‖ + 1e-6)). A non-finite norm skips the
update (gradients are dropped), as Megatron does.

GPU: `MegatronDistOptimizer` wraps `get_megatron_optimizer` (Adam with decoupled weight decay, the
distributed optimizer, clipping inside). It cannot run on this CPU-only development machine.

Learning rate: linear warm-up, lr_k = lr · min(1, (k + 1) / warmup_steps) for update k (k from 0), then
constant.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist

from engine.trainer.optim import OptimConfig


def optim_settings(cfg: Mapping[str, Any] | OptimConfig | None) -> OptimConfig:
    """The AdamW settings from `[trainer.optim]` as a mapping (`name` must be "adamw"), or as given."""
    if cfg is None:
        return OptimConfig()
    if isinstance(cfg, OptimConfig):
        return cfg
    kw = dict(cfg)
    name = kw.pop("name", "adamw")
    if name != "adamw":
        raise ValueError(f"optimizer {name!r} is not supported by the Megatron backend (adamw only)")
    return OptimConfig.from_dict(kw)


def _is_expert(p: torch.Tensor) -> bool:
    return not getattr(p, "allreduce", True)


def global_grad_norm(params: list[torch.nn.Parameter]) -> float:
    """‖g‖₂ over all model-parallel ranks (see the module docstring); grads read from `p.grad`."""
    from megatron.core import parallel_state as ps

    dense_sq = torch.zeros(1, dtype=torch.float64)
    expert_sq = torch.zeros(1, dtype=torch.float64)
    tp_rank, etp_rank = ps.get_tensor_model_parallel_rank(), ps.get_expert_tensor_parallel_rank()
    for p in params:
        if p.grad is None or getattr(p, "shared", False):
            continue
        sharded = bool(getattr(p, "tensor_model_parallel", False))
        sq = p.grad.detach().double().pow(2).sum().cpu()
        if _is_expert(p):
            if sharded or etp_rank == 0:
                expert_sq += sq
        elif sharded or tp_rank == 0:
            dense_sq += sq
    device = params[0].device if params else torch.device("cpu")
    if ps.get_tensor_model_parallel_world_size() * ps.get_pipeline_model_parallel_world_size() > 1:
        t = dense_sq.to(device)
        dist.all_reduce(t, group=ps.get_model_parallel_group())
        dense_sq = t.cpu()
    expert_group = ps.get_expert_tensor_model_pipeline_parallel_group()
    if dist.get_world_size(expert_group) > 1:  # on every rank: a pipeline stage may hold no experts
        t = expert_sq.to(device)
        dist.all_reduce(t, group=expert_group)
        expert_sq = t.cpu()
    return math.sqrt(float(dense_sq + expert_sq))


class MainGradAdamW:
    """torch AdamW over a Megatron DDP model's parameters, stepping on `main_grad`, with global clipping."""

    def __init__(self, params: list[torch.nn.Parameter], settings: OptimConfig, grad_clip: float) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.settings = settings
        self.grad_clip = grad_clip
        decay = [p for p in self.params if p.ndim >= 2]
        no_decay = [p for p in self.params if p.ndim < 2]
        self.opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": settings.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=settings.lr, betas=settings.betas, eps=settings.eps)

    def step(self, lr: float) -> tuple[float, bool]:
        """Clip and apply one update at learning rate `lr`; returns (pre-clip grad norm, applied)."""
        for p in self.params:
            main = getattr(p, "main_grad", None)
            p.grad = None if main is None else (main if main.dtype == p.dtype else main.to(p.dtype))
        norm = global_grad_norm(self.params)
        applied = math.isfinite(norm)
        if applied:
            if self.grad_clip and self.grad_clip > 0:
                coef = self.grad_clip / (norm + 1e-6)
                if coef < 1.0:
                    for p in self.params:
                        if p.grad is not None:
                            p.grad.mul_(coef)
            for group in self.opt.param_groups:
                group["lr"] = lr
            self.opt.step()
        for p in self.params:
            p.grad = None
        return norm, applied

    def state_dict(self) -> dict[str, Any]:
        return self.opt.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.opt.load_state_dict(state)

    def save_extra(self, path: str) -> None:
        """Nothing beyond `state_dict` (kept for interface parity with the distributed optimizer)."""

    def load_extra(self, path: str) -> None:
        """Nothing beyond `state_dict`."""


class MegatronDistOptimizer:
    """Megatron's distributed Adam (GPU only): fp32 main params, sharded state, clipping inside `step`."""

    def __init__(self, ddp_model: torch.nn.Module, settings: OptimConfig, grad_clip: float,
                 params_dtype: torch.dtype) -> None:
        if not torch.cuda.is_available():
            raise RuntimeError("Megatron's distributed optimizer needs CUDA; on CPU use MainGradAdamW")
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        cfg = OptimizerConfig(
            optimizer="adam", lr=settings.lr, min_lr=0.0, weight_decay=settings.weight_decay,
            adam_beta1=settings.betas[0], adam_beta2=settings.betas[1], adam_eps=settings.eps,
            clip_grad=grad_clip, bf16=params_dtype == torch.bfloat16, params_dtype=params_dtype,
            use_distributed_optimizer=True)
        self.opt = get_megatron_optimizer(cfg, [ddp_model])
        self.settings = settings

    def step(self, lr: float) -> tuple[float, bool]:
        for group in self.opt.param_groups:
            group["lr"] = lr
        success, grad_norm, _ = self.opt.step()
        self.opt.zero_grad()
        return float(grad_norm if grad_norm is not None else float("nan")), bool(success)

    def state_dict(self) -> dict[str, Any]:
        return self.opt.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.opt.load_state_dict(state)

    def save_extra(self, path: str) -> None:
        """The sharded Adam moments and fp32 main parameters (Megatron's own per-rank file)."""
        self.opt.save_parameter_state(path)

    def load_extra(self, path: str) -> None:
        self.opt.load_parameter_state(path)
