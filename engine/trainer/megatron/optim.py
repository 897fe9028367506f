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
distributed optimizer, clipping inside; bf16 params get fp32 main params unless `fp32_master_weights` is off).
CPU with bf16 params: `MainGradAdamW` keeps the same fp32 main params itself. It cannot run on this CPU-only development machine.

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


def wrap_ddp(model: torch.nn.Module, layout: Any, on_gpu: bool, fp32_master_weights: bool = True,
             overlap_grad_reduce: bool = False, distributed_optimizer: bool | None = None) -> torch.nn.Module:
    """Megatron's DDP around `model`: gradients reduced in fp32 with `fp32_master_weights`, the distributed
    optimizer's buffers (`distributed_optimizer`, default: on GPU). With `overlap_grad_reduce` each bucket is
    reduced as soon as the last micro-batch's backward fills it; every earlier micro-batch must run under
    `ddp.no_sync()` (the backend's loop does; `config.no_sync_func` makes Megatron's pipeline schedule do it)."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    if layout.etp != layout.tp:
        # megatron-core 0.16 routes expert gradients through the expert-data-parallel reduction only when
        # ep > 1 (`allreduce = not (is_expert and ep > 1)`); with etp < tp and ep = 1 the TP ranks hold
        # whole experts fed different sequence-parallel tokens, whose gradients must be summed over the
        # expert-DP group (which spans those TP ranks), so mark them as expert-parallel here
        for name, p in model.named_parameters():
            if ".experts." in name:
                p.allreduce = False
    dist = on_gpu if distributed_optimizer is None else distributed_optimizer
    cfg = DistributedDataParallelConfig(grad_reduce_in_fp32=fp32_master_weights, overlap_grad_reduce=overlap_grad_reduce,
                                        use_distributed_optimizer=dist)
    ddp = DistributedDataParallel(model.config, cfg, module=model)
    if overlap_grad_reduce:
        model.config.no_sync_func = ddp.no_sync
    return ddp


def build_update(model: torch.nn.Module, layout: Any, on_gpu: bool, settings: OptimConfig, grad_clip: float,
                 dtype: torch.dtype, fp32_master_weights: bool, perf: Mapping[str, Any] | None
                 ) -> tuple[torch.nn.Module, Any]:
    """(DDP, optimizer) for a trainable rank with the resolved Megatron settings `perf`
    (`engine.plan.megatron_perf.perf_values`; None = this device's defaults): Megatron's distributed optimizer
    (CUDA; its state in host memory with `optimizer_offload`) or `MainGradAdamW`, and DDP's overlapped reduce."""
    perf = perf or {}
    dist = on_gpu and bool(perf.get("use_distributed_optimizer", True))
    ddp = wrap_ddp(model, layout, on_gpu, fp32_master_weights, bool(perf.get("overlap_grad_reduce", False)), dist)
    if dist:
        return ddp, MegatronDistOptimizer(ddp, settings, grad_clip, dtype, fp32_master_weights,
                                          cpu_offload=bool(perf.get("optimizer_offload", False)))
    return ddp, MainGradAdamW(list(ddp.parameters()), settings, grad_clip, fp32_master_weights)


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


def global_grad_norm(params: list[torch.nn.Parameter], grads: list[torch.Tensor | None] | None = None) -> float:
    """‖g‖₂ over all model-parallel ranks (see the module docstring); grads read from `p.grad`, or `grads[i]`
    for `params[i]` when given."""
    from megatron.core import parallel_state as ps

    dense_sq = torch.zeros(1, dtype=torch.float64)
    expert_sq = torch.zeros(1, dtype=torch.float64)
    tp_rank, etp_rank = ps.get_tensor_model_parallel_rank(), ps.get_expert_tensor_parallel_rank()
    for i, p in enumerate(params):
        grad = p.grad if grads is None else grads[i]
        if grad is None or getattr(p, "shared", False):
            continue
        sharded = bool(getattr(p, "tensor_model_parallel", False))
        sq = grad.detach().double().pow(2).sum().cpu()
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
    """torch AdamW over a Megatron DDP model's parameters, stepping on `main_grad`, with global clipping.

    `fp32_master_weights` with parameters below fp32 (bf16 compute): AdamW updates fp32 main copies of the
    parameters (Megatron's fp32 main params) on the fp32 `main_grad`s, and each step copies them back into the
    model's bf16 parameters — the update is never rounded to bf16 before it accumulates."""

    def __init__(self, params: list[torch.nn.Parameter], settings: OptimConfig, grad_clip: float,
                 fp32_master_weights: bool = True) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.settings = settings
        self.grad_clip = grad_clip
        self.mains: list[torch.Tensor] = [
            p.detach().float().clone() if fp32_master_weights and p.dtype != torch.float32 else p
            for p in self.params]
        decay = [m for p, m in zip(self.params, self.mains) if p.ndim >= 2]
        no_decay = [m for p, m in zip(self.params, self.mains) if p.ndim < 2]
        self.opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": settings.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=settings.lr, betas=settings.betas, eps=settings.eps)

    def step(self, lr: float) -> tuple[float, bool]:
        """Clip and apply one update at learning rate `lr`; returns (pre-clip grad norm, applied)."""
        grads: list[torch.Tensor | None] = []
        for main in self.mains:
            p = self.params[len(grads)]
            g = getattr(p, "main_grad", None)
            grads.append(None if g is None else (g if g.dtype == main.dtype else g.to(main.dtype)))
        norm = global_grad_norm(self.params, grads)
        applied = math.isfinite(norm)
        if applied:
            coef = self.grad_clip / (norm + 1e-6) if self.grad_clip and self.grad_clip > 0 else 1.0
            for main, g in zip(self.mains, grads):
                main.grad = None if g is None else (g * coef if coef < 1.0 else g)
            for group in self.opt.param_groups:
                group["lr"] = lr
            self.opt.step()
            with torch.no_grad():
                for p, main in zip(self.params, self.mains):
                    if main is not p:
                        p.copy_(main)
        for main in self.mains:
            main.grad = None
        return norm, applied

    def state_dict(self) -> dict[str, Any]:
        return self.opt.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.opt.load_state_dict(state)

    def save_extra(self, path: str) -> None:
        """The fp32 main parameters, when they are copies (the bf16 weights alone would lose their low bits)."""
        if any(m is not p for p, m in zip(self.params, self.mains)):
            torch.save([m if m is not p else None for p, m in zip(self.params, self.mains)], path)

    def load_extra(self, path: str) -> None:
        """The fp32 main parameters `save_extra` wrote (else: from the just-loaded weights)."""
        import os

        saved = torch.load(path, map_location="cpu", weights_only=False) if os.path.exists(path) else None
        with torch.no_grad():
            for i, (p, main) in enumerate(zip(self.params, self.mains)):
                if main is not p:
                    main.copy_(saved[i] if saved is not None else p.float())


class MegatronDistOptimizer:
    """Megatron's distributed Adam (GPU only): fp32 main params, sharded state, clipping inside `step`."""

    def __init__(self, ddp_model: torch.nn.Module, settings: OptimConfig, grad_clip: float,
                 params_dtype: torch.dtype, fp32_master_weights: bool = True, cpu_offload: bool = False) -> None:
        if not torch.cuda.is_available():
            raise RuntimeError("Megatron's distributed optimizer needs CUDA; on CPU use MainGradAdamW")
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        cfg = OptimizerConfig(
            optimizer="adam", lr=settings.lr, min_lr=0.0, weight_decay=settings.weight_decay,
            adam_beta1=settings.betas[0], adam_beta2=settings.betas[1], adam_eps=settings.eps,
            # bf16 = Megatron's mixed-precision optimizer: fp32 main params and Adam state over bf16 weights
            clip_grad=grad_clip, bf16=fp32_master_weights and params_dtype == torch.bfloat16,
            params_dtype=params_dtype,
            use_distributed_optimizer=True,
            # fp32 masters + Adam moments in host memory, stepped there (Megatron's HybridDeviceOptimizer)
            optimizer_cpu_offload=cpu_offload, optimizer_offload_fraction=1.0 if cpu_offload else 0.0)
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
