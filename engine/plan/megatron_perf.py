"""The Megatron trainer's performance settings resolved for a device: what `trainer.*` asks ("auto" = what the
device supports), what the backend builds, and what each costs in the plan's update time. Pure Python.

Resolution (device = the trainer's: cuda, npu or cpu; ep = `trainer.ep`; "auto" values):

    moe_token_dispatcher_type   alltoall on cuda / npu with ep > 1, else allgather (gloo has no all-to-all path)
    use_distributed_optimizer   cuda (Megatron's distributed optimizer needs CUDA); else MainGradAdamW
    overlap_grad_reduce         = use_distributed_optimizer (bucketed async reduce inside the backward)
    optimizer_offload           as set (cuda only: Megatron's HybridDeviceOptimizer)
    attention                   flash on cuda with `use_flash_attn` (Transformer Engine's core attention, Megatron's
                                flash backend), else local (the unfused softmax(QKᵀ/√d)·V; on CPU always)

Settings the backend does not build yet, printed so the dry run says so (each a fixed value here):

    transformer_impl      local      the HF ↔ Megatron weight mapping (convert / export) covers the local spec
    moe_grouped_gemm      false      SequentialMLP: grouped GEMM needs TE's grouped-expert weight layout
    overlap_param_gather  false      the weight export reads the parameters right after the step
    rows                  padded     packed THD rows need Transformer Engine's attention

Update time: the plan's MoE trainer MFU (`engine.predict.costs.TRAIN_MFU_MOE`) stands for the fully fast
configuration verl runs (TE spec, grouped GEMM, all-to-all, overlapped reduce, packed rows). Each slower setting
multiplies it by an efficiency, so predicted update time = fast time / Π efficiencies:

    local spec 0.85 (unfused norm / RoPE / SwiGLU and GEMM epilogues), SequentialMLP 0.6 (MoE: one small GEMM per
    local expert instead of one grouped GEMM), allgather dispatch 0.85 (MoE, ep > 1), no overlapped reduce 0.9
    (dp > 1), padded rows 0.8 (the mean padding of length-balanced micro-batches)

These five are assumptions read from the kernels' work, not measurements: with all five, 0.85·0.6·0.85·0.9·0.8
= 0.31 — the "≥ 2× verl's update time" issue 45 reads off the seed-000 configuration. A GPU run replaces them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.config.schema import RunConfig

EFFICIENCY = {"transformer_impl": 0.85, "moe_grouped_gemm": 0.6, "moe_token_dispatcher_type": 0.85,
              "overlap_grad_reduce": 0.9, "rows": 0.8}
"""Update-time efficiency of each slower setting against the fast one (module docstring; assumptions)."""
FAST = {"transformer_impl": "transformer_engine", "moe_grouped_gemm": True, "moe_token_dispatcher_type": "alltoall",
        "overlap_grad_reduce": True, "overlap_param_gather": True, "rows": "packed (thd)"}
"""The fast configuration (verl's Megatron recipes on CUDA)."""


@dataclass(frozen=True)
class PerfSetting:
    """One resolved setting: its key, value and why."""

    key: str
    value: Any
    why: str

    def line(self) -> str:
        return f"{self.key} = {self.value}  ({self.why})"


def resolve_perf(cfg: RunConfig, device: str) -> list[PerfSetting]:
    """The Megatron settings `cfg` runs with on `device` (module docstring)."""
    t = cfg.trainer
    cuda, accel = device == "cuda", device in ("cuda", "npu")
    out: list[PerfSetting] = [
        PerfSetting("transformer_impl", "local", "Transformer Engine spec not built: the HF ↔ Megatron weight "
                    "mapping covers the local spec"),
        PerfSetting("moe_grouped_gemm", False, "SequentialMLP: grouped GEMM needs TE's grouped-expert layout"),
    ]
    if t.moe_token_dispatcher_type == "auto":
        alltoall = accel and t.ep > 1
        out.append(PerfSetting("moe_token_dispatcher_type", "alltoall" if alltoall else "allgather",
                               f"auto: {'ep > 1 on ' + device if alltoall else ('ep = 1' if accel else device + ': gloo has no all-to-all path')}"))
    else:
        out.append(PerfSetting("moe_token_dispatcher_type", t.moe_token_dispatcher_type, "set"))
    dist = cuda if t.use_distributed_optimizer == "auto" else bool(t.use_distributed_optimizer)
    out.append(PerfSetting("use_distributed_optimizer", dist, ("auto: " if t.use_distributed_optimizer == "auto"
                           else "set: ") + ("sharded fp32 masters and Adam state" if dist else
                                            f"{device}: MainGradAdamW (Megatron's needs CUDA)")))
    overlap = dist if t.overlap_grad_reduce == "auto" else bool(t.overlap_grad_reduce)
    out.append(PerfSetting("overlap_grad_reduce", overlap, ("auto: " if t.overlap_grad_reduce == "auto" else "set: ")
                           + ("buckets reduced inside the backward" if overlap else "reduced after the backward")))
    out.append(PerfSetting("overlap_param_gather", False, "the weight export reads the parameters right after the "
                           "step"))
    out.append(PerfSetting("optimizer_offload", bool(t.optimizer_offload),
                           "fp32 masters and Adam state in host memory" if t.optimizer_offload else "on the GPU"))
    out.append(PerfSetting("rows", "padded", "packed THD rows need Transformer Engine's attention"))
    if t.use_flash_attn and cuda:
        out.append(PerfSetting("attention", "flash", "use_flash_attn: Transformer Engine's core attention, flash "
                               "backend"))
    else:
        out.append(PerfSetting("attention", "local", f"use_flash_attn set, but {device} has no flash attention: the "
                               "local unfused attention runs" if t.use_flash_attn else
                               "the local unfused attention (use_flash_attn = false)"))
    return out


def perf_values(cfg: RunConfig, device: str) -> dict[str, Any]:
    """`resolve_perf` as {key: value}."""
    return {s.key: s.value for s in resolve_perf(cfg, device)}


def update_efficiency(values: dict[str, Any], is_moe: bool, ep: int, dp: int) -> float:
    """Π of the slower settings' efficiencies (module docstring): 1.0 = the fast configuration."""
    eff = 1.0
    if values.get("transformer_impl") != FAST["transformer_impl"]:
        eff *= EFFICIENCY["transformer_impl"]
    if is_moe and not values.get("moe_grouped_gemm"):
        eff *= EFFICIENCY["moe_grouped_gemm"]
    if is_moe and ep > 1 and values.get("moe_token_dispatcher_type") != "alltoall":
        eff *= EFFICIENCY["moe_token_dispatcher_type"]
    if dp > 1 and not values.get("overlap_grad_reduce"):
        eff *= EFFICIENCY["overlap_grad_reduce"]
    if values.get("rows") != FAST["rows"]:
        eff *= EFFICIENCY["rows"]
    return eff
