"""Memory fit per accelerator for the trainer and the rollout, from model facts and the config.

All sizes in GB (10⁹ bytes). P = total parameters, W = trainer GPUs, b = bytes of `model.dtype`.

Trainer (AdamW, mixed precision keeps fp32 master weights when b < 4):
- `torch` (FSDP2, full shard over W): weights P·b/W, gradients P·b/W, optimizer P·(8 + m)/W with
  m = 4 for the fp32 master copy (0 in fp32), plus the gathered parameters of one layer (current and
  prefetched, 2·L₁·b).
- `megatron`: dense parameters split over tp·pp, expert parameters over ep·pp: weights
  (P_dense/(tp·pp) + P_expert/(ep·pp))·b, fp32 main gradients of the same shard ·4, and the distributed
  optimizer sharded over every rank: P·(8 + m)/W.
- reference model (only with `use_kl_loss`): one more copy of the weight shard.
- activations, with activation checkpointing, for T = ppo_micro_batch_size_per_gpu × (max_prompt +
  max_response) / cp tokens per GPU and tensor/sequence parallel tp: layer inputs T/tp·H·b per layer on
  this pipeline stage, one layer's recompute working set T/tp·(8H + 3I')·b (I' = k·I_moe for MoE), and
  the logits in fp32 for the log-probs and their gradient 2·T·V/tp·4.
- runtime overhead (CUDA/CANN context, allocator fragmentation): 2 GB on accelerators.

Rollout, per GPU of a replica with tensor parallel TP: weights P·b/TP; a reserve for activations of
max(1 GB, 5 % of the budget); the KV cache gets the rest of the budget (gpu_memory_utilization × memory
for vLLM, 90 % of memory for the HF sampler). KV bytes per token = 2·layers·⌈n_kv/TP⌉·head_dim·b, and a
full-length sequence needs (max_prompt + max_response) tokens of it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from asyncrl_cli.config.derived import trainer_world
from asyncrl_cli.config.hardware import HardwarePreset
from asyncrl_cli.config.hf_model import ModelFacts
from asyncrl_cli.config.schema import RunConfig

GB = 1e9
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
ACCEL_OVERHEAD_GB = 2.0


@dataclass
class RoleFit:
    """Per-accelerator memory of one role: named components, their total, and the capacity."""

    role: str
    components_gb: dict[str, float]
    total_gb: float
    capacity_gb: float
    fits: bool
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def headroom(self) -> float:
        """Free fraction of the capacity (negative when it does not fit)."""
        return 1 - self.total_gb / self.capacity_gb

    def to_json(self) -> dict[str, Any]:
        """A plain dict (rounded to 0.01 GB) for `--json` output."""
        d = asdict(self)
        d["components_gb"] = {k: round(v, 2) for k, v in self.components_gb.items()}
        d["total_gb"] = round(self.total_gb, 2)
        d["capacity_gb"] = round(self.capacity_gb, 2)
        return d


def _layer_params(f: ModelFacts) -> int:
    """Parameters of one decoder layer (all experts included)."""
    attn = f.hidden * f.heads * f.head_dim * 2 + 2 * f.hidden * f.kv_heads * f.head_dim
    mlp = 3 * f.hidden * (f.experts * f.moe_intermediate if f.is_moe else f.intermediate)
    return attn + mlp


def trainer_fit(cfg: RunConfig, f: ModelFacts, hw: HardwarePreset) -> RoleFit:
    """Per-GPU memory of one trainer rank (see the module docstring for the model)."""
    t = cfg.trainer
    b = DTYPE_BYTES[cfg.model.dtype]
    master = 0 if b == 4 else 4
    world = trainer_world(cfg)
    p = f.params_total
    comp: dict[str, float] = {}
    if t.backend == "megatron":
        p_exp = f.params_expert
        p_dense = p - p_exp
        shard = p_dense / (t.tp * t.pp) + p_exp / (t.ep * t.pp)
        comp["weights"] = shard * b / GB
        comp["gradients"] = shard * 4 / GB
        comp["optimizer"] = p * (8 + master) / world / GB
        tp, cp, pp = t.tp, t.cp, t.pp
    else:
        comp["weights"] = p * b / world / GB
        comp["gradients"] = p * b / world / GB
        comp["optimizer"] = p * (8 + master) / world / GB
        comp["gathered_layer"] = 2 * _layer_params(f) * b / GB
        tp = cp = pp = 1
    if t.use_kl_loss:
        comp["reference"] = comp["weights"]
    tokens = t.ppo_micro_batch_size_per_gpu * (cfg.data.max_prompt_length + cfg.data.max_response_length) / cp
    inter = f.experts_per_token * f.moe_intermediate if f.is_moe else f.intermediate
    act_b = b
    comp["activations"] = (
        tokens / tp * f.hidden * act_b * f.layers / pp
        + tokens / tp * (8 * f.hidden + 3 * inter) * act_b
        + 2 * tokens * f.vocab / tp * 4
    ) / GB
    overhead = ACCEL_OVERHEAD_GB if hw.device != "cpu" else 0.5
    comp["runtime_overhead"] = overhead
    total = sum(comp.values())
    return RoleFit(
        "trainer",
        comp,
        total,
        hw.memory_gb,
        total <= hw.memory_gb,
        {"tokens_per_micro_batch": int(tokens), "world": world},
    )


def rollout_fit(cfg: RunConfig, f: ModelFacts, hw: HardwarePreset) -> RoleFit:
    """Per-GPU memory of one rollout replica rank: weights, reserve and KV cache within the budget."""
    r = cfg.rollout
    b = DTYPE_BYTES[cfg.model.dtype]
    tp = r.tensor_parallel_size
    budget = hw.memory_gb * (r.gpu_memory_utilization if r.backend == "vllm" else 0.9)
    weights = f.params_total * b / tp / GB
    reserve = max(1.0, 0.05 * budget)
    kv_tok = f.kv_bytes_per_token(b, tp)
    max_len = cfg.data.max_prompt_length + cfg.data.max_response_length
    kv_free = budget - weights - reserve
    per_seq_gb = kv_tok * max_len / GB
    seqs_full = int(kv_free // per_seq_gb) if kv_free > 0 else 0
    kv_needed = r.max_num_seqs * per_seq_gb
    kv_used = min(kv_needed, max(kv_free, 0.0))
    comp = {"weights": weights, "activation_reserve": reserve, "kv_cache": kv_used}
    total = weights + reserve + kv_used
    fits = weights + reserve < budget and seqs_full >= 1
    return RoleFit(
        "rollout",
        comp,
        total,
        budget,
        fits,
        {
            "kv_bytes_per_token": kv_tok,
            "max_sequence_tokens": max_len,
            "kv_gb_for_max_num_seqs": round(kv_needed, 2),
            "kv_gb_available": round(max(kv_free, 0.0), 2),
            "seqs_at_full_length": seqs_full,
            "max_num_seqs": r.max_num_seqs,
            "tensor_parallel_size": tp,
            "memory_gb": hw.memory_gb,
        },
    )


@dataclass
class FitReport:
    """Trainer and rollout fit."""

    trainer: RoleFit
    rollout: RoleFit

    def to_json(self) -> dict[str, Any]:
        """A plain dict for `--json` output."""
        return {"trainer": self.trainer.to_json(), "rollout": self.rollout.to_json()}


def estimate_fit(cfg: RunConfig, f: ModelFacts, hw: HardwarePreset) -> FitReport:
    """Both roles' memory fit."""
    return FitReport(trainer_fit(cfg, f, hw), rollout_fit(cfg, f, hw))
