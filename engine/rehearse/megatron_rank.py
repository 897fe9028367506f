"""One Megatron-core trainer rank (`trainer.backend = "megatron"`) rehearsed at full scale on fake tensors.

What runs, over a fake world of M ranks (`engine.rehearse.fake`), with Megatron's three CUDA-only pieces swapped
for named CPU stand-ins (`engine.rehearse.megatron_standins`: context-parallel attention, the distributed
optimizer, the all-to-all dispatcher; the rank's notes list them):

    layout          `ParallelLayout.validate` for the preset's device (cuda), then Megatron's
                    `initialize_model_parallel` at the preset's tp/pp/cp/ep/etp (`init_model_parallel`, without
                    Megatron's gloo copies of the DP groups: the fake process group cannot make gloo groups) —
                    the rank's TP/CP/EP/DP coordinates and group sizes
    build           `build_trainer_backend(distributed=True)` — `MegatronTrainerBackend`, as `TrainerRank` builds
                    it — at the real layout (cp included), with one seam: `hf_weights`, the HF tensors from the
                    model's config.json on fake tensors (the real conversion `hf_to_megatron` shards them into this
                    rank's GPTModel); the reference too with `use_kl_loss`
    export          `export_weights` to its buckets (rank 0 yields them; the gathers run on every rank)
    checkpoint      the host bytes of the HF weights the writer gathers (`iter_hf_tensors`)
                    (this full-depth build keeps the CPU's plain DDP and optimizer: building the distributed
                    optimizer's buffers for 48 layers on fake tensors costs minutes; the step's builds have them)
    step            (`step=True`) `engine.rehearse.megatron_step`: the reference and proximal no-grad passes, the
                    update (forward, the trainer's head — the CP path's owned positions at cp > 1 —, backward,
                    gradient reduce-scatter) and the optimizer step, each phase's peak by category under torch's
                    `MemTracker`, stepped at 1 and 2 layers and extrapolated to the stage's layers (said in the
                    notes); the rank's device peak is the largest phase's
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from engine.rehearse.fake import (
    coalesced_collectives_on_fake_tensors, fake_mode, fake_world, model_from_config, tensor_bytes,
)
from engine.rehearse.megatron_standins import distributed_optimizer_stand_in, megatron_stand_ins
from engine.rehearse.megatron_step import grad_buffers, rehearse_scaled
from engine.rehearse.report import RankClass
from engine.rehearse.torch_rank import STAND_IN, Phase
from engine.sync.fp8 import quantized

if TYPE_CHECKING:
    from engine.plan.run_plan import RunPlan


def megatron_rank_classes(plan: RunPlan) -> list[RankClass]:
    """Megatron's rank classes: rank 0 (the sender: the export's gathers end there, and the checkpoint's HF
    weights are written there) and the others (every rank builds the full HF state at a checkpoint)."""
    world = plan.trainer_ranks
    classes = [RankClass("rank 0 (sender, checkpoint writer)", "0", 0)]
    if world > 1:
        classes.append(RankClass("rank 1 (others)", f"1-{world - 1}" if world > 2 else "1", 1))
    return classes


def _coordinates() -> dict[str, int]:
    from megatron.core import parallel_state as ps

    return {"tp_rank": ps.get_tensor_model_parallel_rank(), "cp_rank": ps.get_context_parallel_rank(),
            "ep_rank": ps.get_expert_model_parallel_rank(), "dp_rank": ps.get_data_parallel_rank(),
            "dp": ps.get_data_parallel_world_size(), "expert_dp": ps.get_expert_data_parallel_world_size()}


def rehearse_megatron_rank(plan: RunPlan, config: dict[str, Any], rank: int, cls: RankClass,
                           step: bool = True) -> RankClass:
    """Rehearse rank `rank` of `plan`'s Megatron trainer (module docstring) into `cls`; `step`: take the step
    (`engine.rehearse.megatron_step`), else the device figure is the resident tensors only."""
    from megatron.core import parallel_state as ps

    from engine.runtime.backends import build_reference_backend, build_trainer_backend
    from engine.trainer.megatron.context_parallel import te_available
    from engine.trainer.megatron.convert import state_dict_getter
    from engine.trainer.megatron.hf_config import arch_from_hf_config
    from engine.trainer.megatron.parallel import ParallelLayout, init_model_parallel

    cfg, start = plan.config, time.perf_counter()
    t, world = cfg.trainer, plan.trainer_ranks
    arch = arch_from_hf_config(config)
    real = ParallelLayout(tp=t.tp, pp=t.pp, cp=t.cp, ep=t.ep, etp=t.etp, world_size=world)
    with Phase("trainer", rank, "layout"):
        if t.cp > 1 and not te_available():  # the preset's check but Transformer Engine's presence
            replace(real, cp=1).validate(on_gpu=True, num_experts=arch.num_experts, num_layers=arch.num_layers,
                                         num_query_groups=arch.num_query_groups)
        else:
            real.validate(on_gpu=plan.device == "cuda", num_experts=arch.num_experts, num_layers=arch.num_layers,
                          num_query_groups=arch.num_query_groups)
    coalesced_collectives_on_fake_tensors()
    spec = plan.role_specs().trainer.backend
    os.environ.setdefault("MASTER_PORT", "29500")  # the rendezvous `init_process_group` skips on the fake world
    mode = fake_mode()

    def build(model_dir: str, model_config: dict[str, Any], stepped: bool = True) -> tuple[Any, Any]:
        """The policy (and the reference with `use_kl_loss`) as `TrainerRank` builds them, on fake HF weights;
        `stepped`: with the distributed optimizer's stand-in (else the CPU's plain DDP and optimizer and no
        reference, for the full-depth build that is exported and checkpointed but not stepped)."""
        getter = state_dict_getter(model_from_config(model_config, cfg.model.dtype, mode).state_dict())
        optimizer = distributed_optimizer_stand_in() if stepped else contextlib.nullcontext()
        with Phase("trainer", rank, "build"), mode, optimizer:
            policy = build_trainer_backend(spec, model_dir, distributed=True, device=STAND_IN, hf_weights=getter)
        if not (t.use_kl_loss and stepped):
            return policy, None
        with Phase("reference", rank, "build"), mode:
            return policy, build_reference_backend(spec, model_dir, distributed=True, device=STAND_IN,
                                                   hf_weights=getter)

    with fake_world(rank, world), tempfile.TemporaryDirectory(prefix="asyncrl-rehearse-") as tmp, \
            megatron_stand_ins(flash=t.use_flash_attn and plan.device == "cuda") as stand_ins:
        cls.notes.extend(f"stand-in for {k}: {v}" for k, v in stand_ins.items())
        (Path(tmp) / "config.json").write_text(json.dumps(config))
        with Phase("trainer", rank, "process groups"):
            init_model_parallel(real, gloo_groups=False)
            cls.checkpoint["coordinates"] = _coordinates()
        policy, _ = build(tmp, config, stepped=False)
        if t.use_kl_loss and t.ref_param_offload:  # the reference: the same GPTModel, frozen (built in the step)
            ref_bytes = tensor_bytes(list(policy.model.parameters()))
            cls.host_start += ref_bytes
            cls.host_resident += ref_bytes
            cls.notes.append("reference weights in host memory between passes (ref_param_offload; the policy's "
                             "shard bytes: the reference is built and stepped in the step's builds)")
        if not cfg.algorithm.rollout_correction.bypass_mode:  # decoupled: `ParamSnapshot`'s two host sets
            from engine.trainer.megatron.snapshot import snapshot_targets

            snap = 2 * tensor_bytes(snapshot_targets(policy.ddp))
            cls.host_resident += snap
            cls.notes.append(f"π_prox snapshot and swap buffers (host, pinned): {snap / 1e9:.2f} GB")
        _resident(policy, cls)
        with Phase("weight sync", rank, "export"), mode:
            ws = plan.role_specs().weight_sync
            _export(policy, ws.bucket_bytes, cls, ws.quantization)
        with Phase("trainer", rank, "checkpoint"), mode:
            _checkpoint(policy, rank, cls)
        del policy
        if step:
            phases = rehearse_scaled(cfg, config, build, rank, cls.notes)
            cls.phase_peaks.update({k: v[0] for k, v in phases.items()})
            cls.phase_categories = {k: v[1] for k, v in phases.items()}
            peak = max(phases, key=lambda k: phases[k][0])
            cls.device_peak, cls.peak_by_category = phases[peak]
            cls.notes.append(f"device peak: the {peak} phase")
        else:
            cls.model_excludes.extend(["optimizer", "activations", "backward_transient", "logprob_head",
                                       "moe_dispatch", "reference_pass"])
            cls.notes.append("step not taken: device figure = resident weights and main gradients")
        ps.destroy_model_parallel()
    cls.seconds = time.perf_counter() - start
    return cls


def _checkpoint(policy: Any, rank: int, cls: RankClass) -> None:
    from engine.trainer.megatron.export import iter_hf_tensors

    # `checkpointing.save_backend`: the HF tensors stream through the same gathers as the export; only
    # the writer (global rank 0) keeps them on the host (with pipeline parallelism every rank sees them)
    to_sender = policy.layout.pp == 1
    weights = largest = 0
    for _, tensor in iter_hf_tensors(policy.model, policy.arch, to_sender=to_sender):
        n = tensor.numel() * tensor.element_size()
        weights, largest = weights + n, max(largest, n)
    cls.host_save = weights if rank == 0 else 0
    cls.checkpoint.update({"writes": ["optimizer shard", "rng", "snapshot"] + (
        ["model.safetensors"] if rank == 0 else []), "weights_bytes": weights if rank == 0 else 0,
        "optimizer_bytes": None, "full_gather": not to_sender, "largest_tensor_bytes": largest})
    cls.notes.append("host at save: the HF weights on the writer only (the others stream them through "
                     "the gathers); the distributed optimizer's DP-0 gather is not rehearsed (CUDA-only)")


def _resident(policy: Any, cls: RankClass) -> None:
    """The rank's resident device tensors at full depth, before any step: its weight shards and DDP's
    main-gradient buffers (the device figure of a rank that is not stepped)."""
    weights = tensor_bytes(list(policy.model.parameters()))
    grads = tensor_bytes(grad_buffers(policy))
    cls.device_peak = weights + grads
    cls.peak_by_category = {"weights": weights, "main_grads": grads}


def _export(policy: Any, bucket_bytes: int, cls: RankClass, quantization: str | None = None) -> None:
    kept: list[torch.Tensor] = []
    total, buckets, by_dtype = 0, 0, {}
    for bucket in quantized(policy.export_weights(bucket_bytes)) if quantization == "fp8" \
            else policy.export_weights(bucket_bytes):  # fp8: what the sender sends (engine.sync.fp8)
        buckets += 1
        for t in bucket.values():
            if any(t is k for k in kept[-4:]):
                continue
            kept.append(t)
            n = t.numel() * t.element_size()
            total += n
            dt = str(t.dtype).removeprefix("torch.")
            by_dtype[dt] = by_dtype.get(dt, 0) + n
    cls.sync = {"bytes": total, "dtypes": by_dtype, "buckets": buckets, "bucket_bytes": bucket_bytes,
                "staged_on": "device (gathered to rank 0)", "stages": bool(total)}
