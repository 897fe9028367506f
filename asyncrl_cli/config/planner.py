"""`asyncrl init`'s choices: backend, parallelism, the rollout/trainer split, batch and async settings.

Rules (each choice is recorded with its reason, and written as a comment):
- CPU: torch trainer and the hf sampler, one trainer worker, the other workers roll out, float32.
- Accelerators: bfloat16. Megatron for MoE models above 20B parameters and for anything above 40B
  (tp 2 when the trainer has ≥ 16 GPUs, cp 2 for sequences ≥ 8k tokens, ep = the largest of 8/4/2 that
  divides both the experts and the trainer GPUs); FSDP2 (torch) otherwise.
- Rollout TP: the smallest power of two whose weight shard is ≤ 40 % of the vLLM budget and that splits
  the attention heads.
- Trainer GPUs: the fewest (whole nodes beyond one node) for which `fit.trainer_fit` leaves 15 % headroom,
  and at least a quarter (MoE) or half (dense) of all GPUs; the rest roll out (a multiple of the TP).
- Batches: n = 16 for math, 4 for multimodal geo3k, 8 otherwise; ppo_mini_batch_size ≈ 512 sequences
  and a multiple of the data-parallel size; micro-batch ≤ 16k tokens per GPU and dividing each rank's share; on
  accelerators token-budget micro-batches (max(16k, one sequence) tokens) and recompute, as verl's scripts.
- Async: staleness 0.5, sync every 4 local steps (every step on CPU), partial rollout on; 100 versions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from asyncrl_cli.config.dotted import set_path
from asyncrl_cli.config.fit import DTYPE_BYTES, trainer_fit
from asyncrl_cli.config.hardware import HardwarePreset
from asyncrl_cli.config.hf_model import ModelFacts
from asyncrl_cli.config.schema import RunConfig

HEADROOM = 0.15
VERSIONS = 100


class PlanError(ValueError):
    """No layout of the given GPUs fits the model."""


@dataclass
class Plan:
    """Values to write, by dotted key, with a reason per key where one helps."""

    values: dict[str, Any] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)

    def set(self, key: str, value: Any, reason: str | None = None) -> None:
        """Record a value (and why)."""
        self.values[key] = value
        if reason:
            self.reasons[key] = reason

    def get(self, key: str) -> Any:
        """A recorded value."""
        return self.values[key]


def _nested(values: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, v in values.items():
        set_path(out, key, v)
    return out


def _config(values: dict[str, Any], data: dict[str, Any]) -> RunConfig:
    merged = _nested(values)
    merged.setdefault("data", {}).update({k: v for k, v in data.items() if k not in merged.get("data", {})})
    return RunConfig.model_validate(merged)


def _layout(gpus: int, per_node: int) -> tuple[int, int]:
    """(nnodes, gpus_per_node) for a pool of `gpus`."""
    if gpus <= per_node:
        return 1, gpus
    return gpus // per_node, per_node


def _round_pool(gpus: int, per_node: int) -> int:
    """Whole nodes above one node; a power of two within one node."""
    if gpus >= per_node:
        return (gpus // per_node) * per_node
    p = 1
    while p * 2 <= gpus:
        p *= 2
    return p


def _splits_heads(f: ModelFacts, tp: int) -> bool:
    return f.heads % tp == 0 and (f.kv_heads % tp == 0 or tp % f.kv_heads == 0)


def rollout_tp(f: ModelFacts, hw: HardwarePreset, util: float) -> int:
    """Smallest power-of-two TP whose weight shard is ≤ 40 % of the per-GPU vLLM budget."""
    weights_gb = f.params_total * 2 / 1e9
    tp = 1
    while tp < hw.gpus_per_node and (weights_gb / tp > 0.4 * util * hw.memory_gb or not _splits_heads(f, tp)):
        tp *= 2
    return tp


def _n_for(data: dict[str, Any]) -> int:
    return {"math": 16, "geo3k": 4}.get(str(data.get("reward", "")), 8)


def _batches(plan: Plan, n: int, dp: int, total_len: int, cpu: bool) -> None:
    mini = 8 if cpu else max(8, 512 // n)
    while (mini * n) % dp:
        mini += 1
    plan.set(
        "trainer.ppo_mini_batch_size", mini, f"{mini} prompts × n {n} = {mini * n} sequences per mini-batch (one optimizer step)"
    )
    per_rank = mini * n // dp
    micro = max(1, min(8, 16384 // total_len))
    while per_rank % micro:
        micro -= 1
    plan.set(
        "trainer.ppo_micro_batch_size_per_gpu", micro, f"≤ 16k tokens per forward ({total_len} per sequence)"
    )
    if not cpu:  # verl's production scripts: token-budget micro-batches (and recompute, `_recompute`)
        budget = max(16384, total_len)
        plan.set("trainer.use_dynamic_bsz", True, "micro-batches by tokens, not rows (verl's use_dynamic_bsz)")
        plan.set("trainer.ppo_max_token_len_per_gpu", budget, f"max(16k, one {total_len}-token sequence)")
        plan.set("trainer.log_prob_max_token_len_per_gpu", budget)


def _recompute(plan: Plan, megatron: bool) -> None:
    """Activation recompute on accelerators, as verl's scripts: HF gradient checkpointing (torch / FSDP2) or
    Megatron's full uniform recompute of one layer at a time."""
    if megatron:
        plan.set("trainer.recompute_granularity", "full", "recompute each layer in the backward")
    else:
        plan.set("trainer.enable_gradient_checkpointing", True, "recompute each layer in the backward")


def plan_run(f: ModelFacts, hw: HardwarePreset, data: dict[str, Any], gpus: int | None) -> Plan:
    """Choose everything `init` writes besides model path, dataset and hardware."""
    plan = Plan()
    total_len = int(data.get("max_prompt_length", 512)) + int(data.get("max_response_length", 512))
    n = _n_for(data)
    plan.set("rollout.n", n, "responses per prompt (GRPO group)")
    if hw.device == "cpu":
        workers = gpus or 2
        if workers < 2:
            raise PlanError("a run needs at least 2 workers: one trainer and one rollout")
        plan.set("model.dtype", "float32")
        plan.set("trainer.backend", "torch", "CPU: FSDP over gloo")
        plan.set("rollout.backend", "hf", "CPU: asyncrl's own sampler")
        for role, count in (("trainer", 1), ("rollout", workers - 1)):
            plan.set(f"resources.{role}.nnodes", 1)
            plan.set(f"resources.{role}.gpus_per_node", count)
        _batches(plan, n, 1, total_len, cpu=True)
        trigger = 1
    else:
        _plan_accelerators(plan, f, hw, data, gpus or hw.gpus_per_node, total_len, n)
        trigger = 4
    plan.set("async_training.staleness_threshold", 0.5, "rollout may run half a sync cycle ahead")
    plan.set("async_training.trigger_parameter_sync_step", trigger, "local steps per weight sync")
    plan.set("async_training.require_batches", 1)
    plan.set("async_training.partial_rollout", True, "resume generations interrupted by a sync")
    per_version = plan.get("trainer.ppo_mini_batch_size") * trigger
    plan.set(
        "rollout.total_rollout_steps",
        per_version * VERSIONS,
        f"{per_version} prompts per version × {VERSIONS}",
    )
    return plan


def _plan_accelerators(
    plan: Plan, f: ModelFacts, hw: HardwarePreset, data: dict[str, Any], gpus: int, total_len: int, n: int
) -> None:
    if gpus < 2:
        raise PlanError("a run needs at least 2 accelerators: trainer and rollout pools are separate")
    gpn = hw.gpus_per_node
    plan.set("model.dtype", "bfloat16")
    util = 0.8
    tp_r = rollout_tp(f, hw, util)
    megatron = (f.is_moe and f.params_total > 20e9) or f.params_total > 40e9
    plan.set(
        "trainer.backend",
        "megatron" if megatron else "torch",
        "Megatron-core for large MoE/dense models" if megatron else "FSDP2 data parallel",
    )
    plan.set("rollout.backend", "vllm")
    plan.set(
        "rollout.tensor_parallel_size", tp_r, f"weights {f.params_total * 2 / 1e9 / tp_r:.1f} GB per GPU"
    )
    plan.set("rollout.gpu_memory_utilization", util)
    share = gpus // 4 if f.is_moe else gpus // 2
    candidates = sorted({_round_pool(t, gpn) for t in range(1, gpus)})
    chosen = None
    for t in candidates:
        if t < share and t != candidates[-1]:
            continue
        if gpus - t < tp_r:
            continue
        _parallel(plan, f, t, total_len, megatron)
        dp = (
            t // (plan.get("trainer.tp") * plan.get("trainer.pp") * plan.get("trainer.cp")) if megatron else t
        )
        _batches(plan, n, dp, total_len, cpu=False)
        _recompute(plan, megatron)
        cfg = _config(
            {
                **plan.values,
                "model.path": "x",
                "resources.trainer.nnodes": _layout(t, gpn)[0],
                "resources.trainer.gpus_per_node": _layout(t, gpn)[1],
            },
            data,
        )
        fit = trainer_fit(cfg, f, hw)
        if fit.total_gb <= (1 - HEADROOM) * hw.memory_gb:
            chosen = t
            break
    if chosen is None:
        need = f.params_total * (DTYPE_BYTES["bfloat16"] * 2 + 12) / 1e9
        raise PlanError(
            f"no split of {gpus} {hw.name} accelerators fits the trainer (model states alone "
            f"~{need:.0f} GB); use more GPUs (--gpus) or bigger hardware"
        )
    rollout = ((gpus - chosen) // tp_r) * tp_r
    if rollout >= gpn:
        rollout = (rollout // gpn) * gpn
    for role, count in (("trainer", chosen), ("rollout", rollout)):
        nn, per = _layout(count, gpn)
        plan.set(f"resources.{role}.nnodes", nn)
        plan.set(f"resources.{role}.gpus_per_node", per)
    plan.reasons["resources.trainer.nnodes"] = f"{chosen} trainer : {rollout} rollout accelerators"


def _parallel(plan: Plan, f: ModelFacts, t: int, total_len: int, megatron: bool) -> None:
    if not megatron:
        return
    tp = 2 if t >= 16 and _splits_heads(f, 2) else 1
    cp = 2 if total_len >= 8192 and (t // tp) % 2 == 0 else 1
    ep = 1
    if f.is_moe:
        ep = next(d for d in (8, 4, 2, 1) if f.experts % d == 0 and t % d == 0)
    plan.set("trainer.tp", tp, "tensor parallel inside a node")
    plan.set("trainer.pp", 1)
    plan.set("trainer.cp", cp, "context parallel for long sequences" if cp > 1 else None)
    plan.set("trainer.ep", ep, "expert parallel" if ep > 1 else None)
