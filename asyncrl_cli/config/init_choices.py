"""`asyncrl init`'s choices: backend, parallelism, the rollout/trainer split, batch and async settings.

Rules (each choice is recorded with its reason, and written as a comment):
- CPU: torch trainer and the hf sampler, one trainer worker, the other workers roll out, float32.
- Accelerators: bfloat16. Megatron for MoE models above 20B parameters and for anything above 40B;
  FSDP2 (torch) otherwise.
- Rollout replica: the smallest shape whose weights per GPU (`engine.plan.rollout_replica`) are ≤ 40 % of the
  vLLM budget: TP 1, 2, 4, … inside a node (splitting the attention heads), then k = 2, 3, … nodes with TP = a
  node and data × expert parallel (EP = TP·DP dividing the experts) for MoE, pipeline stages for dense models.
  On CUDA the smallest fp8 replica is tried next when it takes fewer GPUs (with token-level rollout IS for the
  quantisation gap); the first that leaves a trainer layout wins (bf16 first). On CUDA, when no layout fits,
  the search runs again with the Megatron optimizer state in host memory (`trainer.optimizer_offload`).
- The split search: trainer pools from the fewest GPUs (whole nodes beyond one node; at least a quarter (MoE)
  or half (dense) of all GPUs first, then any), and for each pool the Megatron layouts in order of model
  parallel size tp·pp (pp dividing the layers, tp splitting the heads inside a node), cp 2 for sequences ≥ 8k
  tokens (else 1), ep from 8/4/2/1 first and then the larger divisors of the experts that divide tp·cp·dp
  (Megatron's rule with etp = 1). The
  optimizer state is sharded over every trainer rank (Megatron's distributed optimizer, FSDP2's full shard).
  Activation recompute is on (gradient checkpointing for FSDP2, `recompute_granularity = "full"` for
  Megatron), as verl's recipes run. The memory is `engine.plan.memory`'s model (through `fit.trainer_fit`).
  The first layout for which `fit.trainer_fit` leaves 15 % headroom and that `validate`'s own analysis passes
  without an error is written; when none does, `init` refuses with the reason (exit 3), so it never writes a
  preset that `validate` rejects.
- Batches: n = 16 for math (`math`, `math_dapo`), 4 for multimodal geo3k, 8 otherwise; ppo_mini_batch_size ≈ 512 sequences
  and a multiple of the data-parallel size; micro-batch ≤ 16k tokens per GPU and dividing each rank's share; on
  accelerators with pp = 1, token-budget micro-batches (max(16k, one sequence) tokens), as verl's scripts.
- Async: staleness 0.5, sync every 4 local steps (every step on CPU), partial rollout on; 100 versions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from asyncrl_cli.config.dotted import set_path
from asyncrl_cli.config.fit import DTYPE_BYTES, trainer_fit
from engine.plan.hardware import HardwarePreset
from asyncrl_cli.config.hf_model import ModelFacts
from engine.config.schema import RunConfig

HEADROOM = 0.15
VERSIONS = 100


class InitRefused(ValueError):
    """No layout of the given GPUs fits the model."""


@dataclass
class InitChoices:
    """What `init` writes: values by dotted key, with a reason per key where one helps."""

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


def _replica_cfg(shape: dict[str, Any], quantization: str | None) -> Any:
    """The few config attributes `engine.plan.rollout_replica` reads, for a candidate replica."""
    from types import SimpleNamespace

    rollout = SimpleNamespace(backend="vllm", dtype=None, quantization=quantization, **shape)
    return SimpleNamespace(rollout=rollout, model=SimpleNamespace(dtype="bfloat16"))


def _replica_shapes(f: ModelFacts, per_node: int) -> list[dict[str, int]]:
    """Replica shapes in order of size: TP 1, 2, 4, … inside a node (splitting the heads), then across k = 2, 3, …
    nodes with TP = a node: data × expert parallel for MoE (EP = TP·DP dividing the experts), pipeline stages for
    dense models."""
    out = []
    tp = 1
    while tp <= per_node:
        if _splits_heads(f, tp) and per_node % tp == 0:
            out.append({"tensor_parallel_size": tp, "pipeline_model_parallel_size": 1, "data_parallel_size": 1,
                        "expert_parallel_size": 1})
        tp *= 2
    if not _splits_heads(f, per_node):
        return out
    for k in range(2, 33):
        if f.is_moe:
            if f.experts % (per_node * k) == 0:
                out.append({"tensor_parallel_size": per_node, "pipeline_model_parallel_size": 1,
                            "data_parallel_size": k, "expert_parallel_size": per_node * k})
        elif k <= f.layers:
            out.append({"tensor_parallel_size": per_node, "pipeline_model_parallel_size": k,
                        "data_parallel_size": 1, "expert_parallel_size": 1})
    return out


def rollout_replica(f: ModelFacts, hw: HardwarePreset, util: float, quantization: str | None = None
                    ) -> dict[str, int] | None:
    """The smallest replica shape whose weights per GPU (`engine.plan.rollout_replica.weights_per_gpu`, in bf16
    or fp8) are ≤ 40 % of the per-GPU vLLM budget; None when no shape up to 32 nodes is. An fp8 shape must keep
    every rank's matrices whole 128-blocks (`fp8_block_misfits`, validate's `rollout-fp8-blocks`)."""
    from engine.plan.rollout_replica import fp8_block_misfits, weights_per_gpu

    for shape in _replica_shapes(f, hw.gpus_per_node):
        if quantization == "fp8" and fp8_block_misfits(f, shape["tensor_parallel_size"],
                                                       shape["expert_parallel_size"]):
            continue
        if weights_per_gpu(_replica_cfg(shape, quantization), f) <= 0.4 * util * hw.memory_gb * 1e9:
            return shape
    return None


def _n_for(data: dict[str, Any]) -> int:
    return {"math": 16, "math_dapo": 16, "geo3k": 4}.get(str(data.get("reward", "")), 8)


def _batches(choices: InitChoices, n: int, dp: int, total_len: int, cpu: bool, budgets: bool = False) -> None:
    """Mini- and micro-batch sizes; with `budgets` (accelerators, no pipeline) token-budget micro-batches as
    verl's production scripts run them: max(16k, one sequence) tokens per GPU."""
    mini = 8 if cpu else max(8, 512 // n)
    while (mini * n) % dp:
        mini += 1
    choices.set(
        "trainer.ppo_mini_batch_size", mini, f"{mini} prompts × n {n} = {mini * n} sequences per mini-batch (one optimizer step)"
    )
    per_rank = mini * n // dp
    micro = max(1, min(8, 16384 // total_len))
    while per_rank % micro:
        micro -= 1
    choices.set(
        "trainer.ppo_micro_batch_size_per_gpu", micro, f"≤ 16k tokens per forward ({total_len} per sequence)"
    )
    if cpu:
        return
    choices.set("trainer.use_dynamic_bsz", budgets,
             "micro-batches by tokens, not rows (verl's use_dynamic_bsz)" if budgets else
             "token budgets need pp = 1")
    if budgets:
        budget = max(16384, total_len)
        choices.set("trainer.ppo_max_token_len_per_gpu", budget, f"max(16k, one {total_len}-token sequence)")
        choices.set("trainer.log_prob_max_token_len_per_gpu", budget)


def choose_init_settings(f: ModelFacts, hw: HardwarePreset, data: dict[str, Any], gpus: int | None,
             model_path: str = "x") -> InitChoices:
    """Choose everything `init` writes besides model path, dataset and hardware."""
    choices = InitChoices()
    total_len = int(data.get("max_prompt_length", 512)) + int(data.get("max_response_length", 512))
    n = _n_for(data)
    choices.set("rollout.n", n, "responses per prompt (GRPO group)")
    if hw.device == "cpu":
        workers = gpus or 2
        if workers < 2:
            raise InitRefused("a run needs at least 2 workers: one trainer and one rollout")
        choices.set("model.dtype", "float32")
        choices.set("trainer.backend", "torch", "CPU: FSDP over gloo")
        choices.set("rollout.backend", "hf", "CPU: asyncrl's own sampler")
        for role, count in (("trainer", 1), ("rollout", workers - 1)):
            choices.set(f"resources.{role}.nnodes", 1)
            choices.set(f"resources.{role}.gpus_per_node", count)
        _batches(choices, n, 1, total_len, cpu=True)
        trigger = 1
    else:
        _choose_accelerators(choices, f, hw, data, gpus or hw.gpus_per_node, total_len, n, model_path)
        trigger = 4
    choices.set("async_training.staleness_threshold", 0.5, "rollout may run half a sync cycle ahead")
    choices.set("async_training.trigger_parameter_sync_step", trigger, "local steps per weight sync")
    choices.set("async_training.require_batches", 1)
    choices.set("async_training.partial_rollout", True, "resume generations interrupted by a sync")
    per_version = choices.get("trainer.ppo_mini_batch_size") * trigger
    choices.set(
        "rollout.total_rollout_steps",
        per_version * VERSIONS,
        f"{per_version} prompts per version × {VERSIONS}",
    )
    return choices


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _layouts(f: ModelFacts, t: int, per_node: int, total_len: int) -> list[tuple[int, int, int, int]]:
    """Megatron (tp, pp, cp, ep) for `t` trainer GPUs with `per_node` per node, in order of preference."""
    tps = [tp for tp in (1, 2, 4, 8) if per_node % tp == 0 and f.heads % tp == 0 and f.kv_heads % tp == 0]
    pps = [pp for pp in _divisors(f.layers) if pp <= 16]
    cps = (2, 1) if total_len >= 8192 else (1,)
    out = []
    for tp, pp in sorted(((tp, pp) for tp in tps for pp in pps), key=lambda x: (x[0] * x[1], x[1])):
        for cp in cps:
            if t % (tp * pp * cp):
                continue
            eps = [1]
            if f.is_moe:
                fits = [e for e in _divisors(f.experts) if (t // pp) % e == 0]  # Megatron: ep | tp·cp·dp
                eps = [e for e in (8, 4, 2, 1) if e in fits] + [e for e in fits if e > 8]
            out += [(tp, pp, cp, ep) for ep in eps]
    return out


def _errors(values: dict[str, Any], data: dict[str, Any], hw: HardwarePreset) -> list[str]:
    """The errors `validate` would report for these values (its own analysis, on the config init writes)."""
    from asyncrl_cli.config.loader import analyze_config
    from asyncrl_cli.config.provenance import Provenance

    an = analyze_config(_config({**values, "resources.hardware": hw.name}, data), Provenance())
    return [p.message for p in an.problems if p.severity == "error"]


def _choose(choices: InitChoices, pools_values: dict[str, Any], split: str) -> None:
    for k, v in pools_values.items():
        choices.set(k, v)
    choices.reasons["resources.trainer.nnodes"] = split


def _replica_candidates(f: ModelFacts, hw: HardwarePreset, util: float) -> list[tuple[dict[str, int], str | None]]:
    """Replica shapes to try, with their weight format: the smallest bf16 one, then (CUDA) the smallest fp8 one
    when it takes fewer GPUs (more left for the trainer)."""
    out: list[tuple[dict[str, int], str | None]] = []
    bf16 = rollout_replica(f, hw, util)
    if bf16 is not None:
        out.append((bf16, None))
    fp8 = rollout_replica(f, hw, util, "fp8") if hw.device == "cuda" else None
    if fp8 is not None and (bf16 is None or _gpus(fp8) < _gpus(bf16)):
        out.append((fp8, "fp8"))
    return out


def _gpus(shape: dict[str, int]) -> int:
    return shape["tensor_parallel_size"] * shape["pipeline_model_parallel_size"] * shape["data_parallel_size"]


def _choose_accelerators(
    choices: InitChoices, f: ModelFacts, hw: HardwarePreset, data: dict[str, Any], gpus: int, total_len: int, n: int,
    model_path: str = "x",
) -> None:
    if gpus < 2:
        raise InitRefused("a run needs at least 2 accelerators: trainer and rollout pools are separate")
    choices.set("model.dtype", "bfloat16")
    util = 0.8
    candidates = _replica_candidates(f, hw, util)
    if not candidates:
        raise InitRefused(
            f"the rollout cannot hold the model: {f.params_total * 2 / 1e9:.0f} GB of bf16 weights do not fit "
            f"replicas of up to 32 {hw.name} nodes ({hw.gpus_per_node} × {hw.memory_gb:g} GB at "
            f"gpu_memory_utilization {util})")
    megatron = (f.is_moe and f.params_total > 20e9) or f.params_total > 40e9
    choices.set(
        "trainer.backend",
        "megatron" if megatron else "torch",
        "Megatron-core for large MoE/dense models" if megatron else "FSDP2 data parallel",
    )
    if megatron:
        choices.set("trainer.recompute_granularity", "full", "activation recompute, as verl's Megatron recipes")
    else:
        choices.set("trainer.enable_gradient_checkpointing", True, "activation recompute, as verl's FSDP recipes")
    choices.set("rollout.backend", "vllm")
    choices.set("rollout.gpu_memory_utilization", util)
    tight: tuple[float, dict[str, Any], dict[str, Any], str, dict[str, str]] | None = None
    last_reason = "no trainer pool leaves room for a rollout replica"
    base, base_reasons = dict(choices.values), dict(choices.reasons)
    offloads = (False, True) if megatron and hw.device == "cuda" else (False,)
    for shape, quant, offload in [(s_, q, o) for o in offloads for s_, q in candidates]:
        choices.values, choices.reasons = dict(base), dict(base_reasons)
        _set_replica(choices, f, hw, shape, quant)
        if offload:
            choices.set("trainer.optimizer_offload", True, "fp32 masters and Adam state in host memory (Megatron's "
                        "optimizer_cpu_offload; verl's large-MoE recipes): no layout fits the GPUs without it")
        found, reason, lean = _search_pools(choices, f, hw, data, gpus, total_len, n, model_path, megatron,
                                            _gpus(shape))
        if found:
            return
        last_reason = reason
        if lean is not None and (tight is None or lean[0] < tight[0]):
            tight = lean
    if tight is not None:
        choices.values, choices.reasons = tight[1], tight[4]
        _choose(choices, tight[2], f"{tight[3]}; ~{tight[0]:.0f} of {hw.memory_gb:g} GB per GPU (no layout leaves "
                                f"{HEADROOM:.0%} headroom)")
        return
    need = f.params_total * (DTYPE_BYTES["bfloat16"] * 2 + 12) / 1e9
    raise InitRefused(
        f"no split of {gpus} {hw.name} accelerators fits the trainer (model states ~{need:.0f} GB in all; "
        f"{last_reason}); use more GPUs (--gpus) or bigger hardware"
    )


def _set_replica(choices: InitChoices, f: ModelFacts, hw: HardwarePreset, shape: dict[str, int],
                 quant: str | None) -> None:
    """Record a replica shape (and its weight format) with the reasons."""
    from engine.plan.rollout_replica import weights_per_gpu

    g = _gpus(shape)
    per_gpu = weights_per_gpu(_replica_cfg(shape, quant), f) / 1e9
    where = f"{g // hw.gpus_per_node} nodes" if g > hw.gpus_per_node else "one node"
    choices.set("rollout.tensor_parallel_size", shape["tensor_parallel_size"],
                f"replica of {g} GPUs on {where}: weights {per_gpu:.1f} GB per GPU")
    for key in ("pipeline_model_parallel_size", "data_parallel_size", "expert_parallel_size"):
        if shape[key] > 1:
            why = {"pipeline_model_parallel_size": "pipeline stages across nodes",
                   "data_parallel_size": "data-parallel attention ranks across nodes",
                   "expert_parallel_size": "experts spread over tp × dp ranks"}[key]
            choices.set(f"rollout.{key}", shape[key], why)
    if quant:
        choices.set("rollout.quantization", quant, "blockwise fp8 weights: half the bf16 replica, more GPUs left "
                    "for the trainer")
        choices.set("algorithm.rollout_correction.rollout_is", "token",
                    "token-level IS absorbs the fp8 quantisation gap (verl's FP8 recipe)")
        choices.set("algorithm.rollout_correction.bypass_mode", False,
                    "decoupled: the IS weights reach the loss (π_prox snapshot in host memory)")


def _search_pools(choices: InitChoices, f: ModelFacts, hw: HardwarePreset, data: dict[str, Any], gpus: int,
                  total_len: int, n: int, model_path: str, megatron: bool, g: int
                  ) -> tuple[bool, str, tuple[float, dict[str, Any], dict[str, Any], str, dict[str, str]] | None]:
    """The trainer-pool search for replicas of `g` GPUs: (found a layout with headroom, the last reason, the
    leanest layout that fits without the headroom)."""
    gpn = hw.gpus_per_node
    share = gpus // 4 if f.is_moe else gpus // 2
    pools = sorted({_round_pool(t, gpn) for t in range(1, gpus)})
    pools = [t for t in pools if t >= share] + [t for t in pools if t < share]
    last_reason = "no trainer pool leaves room for a rollout replica"
    best_gb = float("inf")
    tight: tuple[float, dict[str, Any], dict[str, Any], str, dict[str, str]] | None = None  # fits, but within the headroom
    for t in pools:
        rollout = ((gpus - t) // g) * g
        if rollout >= gpn:
            rollout = (rollout // max(g, gpn)) * max(g, gpn)
        if rollout < g:
            continue
        pools_values = {}
        for role, count in (("trainer", t), ("rollout", rollout)):
            nn, per = _layout(count, gpn)
            pools_values[f"resources.{role}.nnodes"] = nn
            pools_values[f"resources.{role}.gpus_per_node"] = per
        split = f"{t} trainer : {rollout} rollout accelerators"
        layouts = _layouts(f, t, pools_values["resources.trainer.gpus_per_node"], total_len) if megatron else [
            (1, 1, 1, 1)]
        for tp, pp, cp, ep in layouts:
            if megatron:
                choices.set("trainer.tp", tp, "tensor parallel inside a node" if tp > 1 else None)
                choices.set("trainer.pp", pp, "pipeline stages" if pp > 1 else None)
                choices.set("trainer.cp", cp, "context parallel for long sequences" if cp > 1 else None)
                choices.set("trainer.ep", ep, "expert parallel" if ep > 1 else None)
            _batches(choices, n, t // (tp * pp * cp), total_len, cpu=False, budgets=pp == 1)
            values = {**choices.values, **pools_values, "model.path": model_path}
            fit = trainer_fit(_config(values, data), f, hw)
            roomy = fit.total_gb <= (1 - HEADROOM) * hw.memory_gb
            if not roomy and (fit.total_gb > hw.memory_gb or (tight is not None and tight[0] <= fit.total_gb)):
                if fit.total_gb < best_gb:
                    best_gb = fit.total_gb
                    shape = f", tp {tp} pp {pp} cp {cp} ep {ep}" if megatron else ""
                    last_reason = (f"the trainer needs ~{fit.total_gb:.0f} GB per GPU at best ({t} trainer GPUs"
                                   f"{shape}); {hw.name} has {hw.memory_gb:g} GB")
                continue
            errors = _errors(values, data, hw)
            if errors:
                last_reason, best_gb = errors[0], -1.0  # a layout that fits memory but validate refuses
                continue
            if not roomy:  # remember the leanest that fits, in case none leaves the headroom
                tight = (fit.total_gb, dict(choices.values), pools_values, split, dict(choices.reasons))
                continue
            _choose(choices, pools_values, split)
            return True, "", None
    return False, last_reason, tight
