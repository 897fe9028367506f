"""Rules on the Megatron performance settings (`engine.config.megatron_perf`) against the backend and the device
(`engine.plan.megatron_perf` resolves the "auto" ones): what a device cannot run is an error, what it ignores a
warning."""

from __future__ import annotations

from asyncrl_cli.config.problems import Problem, error, warn
from engine.config.schema import RunConfig
from engine.plan.hardware import HardwarePreset

PERF_KEYS = ("moe_token_dispatcher_type", "use_distributed_optimizer", "overlap_grad_reduce", "optimizer_offload")


def perf_rules(cfg: RunConfig, hw: HardwarePreset) -> list[Problem]:
    """Megatron settings set explicitly where they cannot run (or have no effect)."""
    t, out = cfg.trainer, []
    explicit = [k for k in PERF_KEYS if getattr(t, k) not in ("auto", False)]
    if t.backend != "megatron":
        if explicit:
            out.append(warn("megatron-perf-backend", f"trainer.{explicit[0]}",
                            f"{', '.join(explicit)}: Megatron settings, ignored by the {t.backend} backend"))
        return out
    if hw.device != "cuda":
        if t.use_distributed_optimizer is True:
            out.append(error("megatron-distopt-device", "trainer.use_distributed_optimizer",
                             f"Megatron's distributed optimizer needs CUDA; '{hw.name}' is {hw.device}",
                             "leave it \"auto\" (MainGradAdamW, the same math unsharded)"))
        if t.optimizer_offload:
            out.append(warn("megatron-offload-device", "trainer.optimizer_offload",
                            f"optimizer offload is Megatron's CUDA optimizer's; ignored on {hw.device}"))
    if hw.device == "cpu" and t.moe_token_dispatcher_type == "alltoall":
        out.append(error("megatron-alltoall-cpu", "trainer.moe_token_dispatcher_type",
                         "the all-to-all dispatcher needs CUDA streams; CPU (gloo) runs `allgather`"))
    dist = t.use_distributed_optimizer is True or (t.use_distributed_optimizer == "auto" and hw.device == "cuda")
    if t.optimizer_offload and not dist and hw.device == "cuda":
        out.append(error("megatron-offload-distopt", "trainer.optimizer_offload",
                         "optimizer offload needs the distributed optimizer (use_distributed_optimizer)"))
    return out
