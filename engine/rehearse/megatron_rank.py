"""One Megatron-core trainer rank (`trainer.backend = "megatron"`) rehearsed at full scale on fake tensors.

What runs, over a fake world of M ranks (`engine.rehearse.fake`):

    layout          `ParallelLayout.validate` for the preset's device (cuda), then Megatron's
                    `initialize_model_parallel` at the preset's tp/pp/cp/ep/etp (`init_model_parallel`, without
                    Megatron's gloo copies of the DP groups: the fake process group cannot make gloo groups) —
                    the rank's TP/CP/EP/DP coordinates and group sizes
    build           `build_trainer_backend(distributed=True)` — `MegatronTrainerBackend`, as `TrainerRank` builds
                    it — with one seam: `hf_weights`, the HF tensors from the model's config.json on fake tensors
                    (the real conversion `hf_to_megatron` shards them into this rank's GPTModel); the reference too
                    with `use_kl_loss`
    step            (`step=True` only: too slow for the CLI, see `STEP_NOT_REHEARSED`; without it the resident
                    weight shards and DDP main-grad buffers are measured) `_forward` (pack, GPTModel, vocab-parallel chunked head) of the update's micro-batch, backward
                    of the masked token-mean of −A·log π, `finalize_model_grads`, under torch's `MemTracker`; outside
                    the fake mode, so the batch's packing reads real values (the fake parameters carry the model's
                    ops into their mode; the few tensors the model makes from scratch, masks and rotary tables, are
                    real and counted too)
    export          `export_weights` to its buckets (rank 0 yields them; the gathers run on every rank)
    checkpoint      the host bytes of `hf_state_dict()` (every rank builds the full HF state) and of the
                    optimizer's state dict

What cannot run here, and so is rehearsed on a stand-in (each says so in the rank's notes):
    context parallelism (cp > 1): its attention is Transformer Engine's on CUDA (`context_parallel.py`), neither
        of which this CPU has; the rank is built and stepped at cp = 1 over the same tp/ep/etp, so it forwards
        T/tp tokens where the preset's rank forwards T/(cp·tp) — its activations are an upper bound, and the
        CP path's own head (issue 43 N2) is not exercised
    the CUDA code paths: the all-to-all token dispatcher and Megatron's distributed optimizer are CUDA-only; the
        CPU stand-in runs the all-gather dispatcher and `MainGradAdamW`, so the optimizer step and its state are
        not rehearsed (the fp32 master + m + v the distributed optimizer shards over DP are the memory model's)
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from engine.rehearse.batch import micro_shape, rehearsal_batch
from engine.rehearse.fake import fake_mode, fake_world, model_from_config, tensor_bytes, tracker_peak
from engine.rehearse.report import RankClass
from engine.rehearse.torch_rank import STAND_IN, Phase, surrogate_loss
from engine.sync.fp8 import quantized

if TYPE_CHECKING:
    from engine.config.schema import RunConfig
    from engine.plan.run_plan import RunPlan


STEP_NOT_REHEARSED = ("under fake tensors the forward and backward of 48 MoE layers (16 local experts each, "
                      "SequentialMLP) did not finish within 15 min on 2 shared cores")
"""Why `asyncrl rehearse` does not take the Megatron step by default (`rehearse_megatron_rank(step=True)` does)."""


def _tracker_class() -> Any:
    """torch's `MemTracker`, which installs gradient hooks only on modules that train (a frozen reference's
    forward would otherwise fail: no hook on a tensor without gradient) and passes over Megatron's DDP wrapper."""
    from torch.distributed._tools.mem_tracker import MemTracker

    class Tracker(MemTracker):
        def _track_module_params_and_buffers(self, module: Any, install_grad_hooks: bool = True) -> Any:
            if not callable(module.buffers):  # Megatron's DDP wrapper (`buffers`: its grad buffers, a list);
                return 0, 0  # its parameters are the GPTModel's, tracked at the GPTModel's own forward
            trains = all(p.requires_grad for p in module.parameters())
            return super()._track_module_params_and_buffers(module, install_grad_hooks and trains)

    return Tracker


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
    """Rehearse rank `rank` of `plan`'s Megatron trainer (module docstring) into `cls`."""
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
    stand = real if real.cp == 1 else replace(real, cp=1)
    if stand is not real:
        cls.notes.append(f"cp = {real.cp} not rehearsed (Transformer Engine attention on CUDA): built and stepped "
                         f"at cp = 1 (activations for T/tp tokens: an upper bound; the CP head path not run)")
    cls.notes.append("CUDA-only paths not rehearsed: the all-to-all dispatcher (all-gather here) and the "
                     "distributed optimizer (its step and fp32 state are the memory model's)")
    os.environ.setdefault("MASTER_PORT", "29500")  # the rendezvous `init_process_group` skips on the fake world
    mode = fake_mode()
    with fake_world(rank, world), tempfile.TemporaryDirectory(prefix="asyncrl-rehearse-") as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(config))
        with Phase("trainer", rank, "process groups"):
            init_model_parallel(real, gloo_groups=False)
            cls.checkpoint["coordinates"] = _coordinates()
            ps.destroy_model_parallel()
            init_model_parallel(stand, gloo_groups=False)
        spec = plan.role_specs().trainer.backend
        stand_spec = replace(spec, megatron=replace(spec.megatron, cp=stand.cp))
        with Phase("trainer", rank, "build"):
            hf = model_from_config(config, cfg.model.dtype, mode)
            getter = state_dict_getter(hf.state_dict())
            with mode:
                policy = build_trainer_backend(stand_spec, tmp, distributed=True, device=STAND_IN, hf_weights=getter)
        ref = None
        if t.use_kl_loss:
            with Phase("reference", rank, "build"), mode:
                ref = build_reference_backend(stand_spec, tmp, distributed=True, device=STAND_IN, hf_weights=getter)
            if t.ref_param_offload:
                cls.host_start += tensor_bytes(list(ref.model.parameters()))
                cls.host_resident += tensor_bytes(list(ref.model.parameters()))
                cls.notes.append("reference weights in host memory between passes (ref_param_offload)")
        if not cfg.algorithm.rollout_correction.bypass_mode:  # decoupled: `ParamSnapshot`'s two host sets
            from engine.trainer.megatron.snapshot import snapshot_targets

            snap = 2 * tensor_bytes(snapshot_targets(policy.ddp))
            cls.host_resident += snap
            cls.notes.append(f"π_prox snapshot and swap buffers (host, pinned): {snap / 1e9:.2f} GB")
        if step:
            _step(cfg, policy, ref, mode, arch.vocab_size, rank, cls)
        else:
            _resident(policy, cls)
        with Phase("weight sync", rank, "export"), mode:
            ws = plan.role_specs().weight_sync
            _export(policy, ws.bucket_bytes, cls, ws.quantization)
        with Phase("trainer", rank, "checkpoint"), mode:
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
        ps.destroy_model_parallel()
    cls.seconds = time.perf_counter() - start
    return cls


def _step(cfg: RunConfig, policy: Any, ref: Any, mode: Any, vocab: int, rank: int, cls: RankClass) -> None:
    from megatron.core.distributed import finalize_model_grads

    from engine.trainer.batch import plan_micro_batches, trim_padding

    update = rehearsal_batch(micro_shape(cfg), vocab)
    log_prob = rehearsal_batch(micro_shape(cfg, log_prob=True), vocab)
    tracker = _tracker_class()()
    # the GPTModel and DDP's contiguous main-grad buffers (the DDP wrapper itself cannot be handed over: its
    # `buffers` attribute, a list of Megatron's grad buffers, hides `Module.buffers()`)
    grads = [b.grad_data for b in [*policy.ddp.buffers, *policy.ddp.expert_parallel_buffers]]
    tracker.track_external(policy.model, *grads)
    cls.model_excludes.append("optimizer")
    with tracker:
        if ref is not None:
            with Phase("reference", rank, "log-prob"):
                micros, _ = plan_micro_batches(log_prob, ref.micro_batch_size, ref.log_prob_budget, lambda k: k)
                micro, _ = trim_padding(micros[0])
                with torch.no_grad():
                    ref._forward(micro, False)
            cls.phase_peaks["reference log-prob"] = tracker_peak(tracker)[0]
        with Phase("trainer", rank, "update"):
            policy.ddp.train()
            micros, _ = plan_micro_batches(update, policy.micro_batch_size, policy.update_budget, lambda k: k)
            policy.ddp.zero_grad_buffer()
            for m in micros:
                micro, _ = trim_padding(m)
                log_probs, entropy = policy._forward(micro, policy.entropy_mode != "none")
                loss = surrogate_loss(log_probs, entropy, micro, policy.entropy_mode == "grad")
                (loss * policy.dp_size).backward()
            finalize_model_grads([policy.ddp])
        cls.phase_peaks["update"] = tracker_peak(tracker)[0]
    cls.device_peak, cls.peak_by_category = tracker_peak(tracker)


def _resident(policy: Any, cls: RankClass) -> None:
    """Without the step: the rank's resident device tensors — its weight shards and DDP's main-grad buffers —
    compared with the memory model's weights and gradients terms only."""
    weights = tensor_bytes(list(policy.model.parameters()))
    grads = tensor_bytes([b.grad_data for b in [*policy.ddp.buffers, *policy.ddp.expert_parallel_buffers]])
    cls.device_peak, cls.peak_by_category = weights + grads, {"weights": weights, "main_grads": grads}
    cls.model_excludes.extend(["optimizer", "compute_copy", "reference", "activations", "backward_transient",
                               "logprob_head", "moe_dispatch", "attention_scores"])
    cls.notes.append(f"step not rehearsed: {STEP_NOT_REHEARSED}; device figure = resident weights + main-grad "
                     "buffers only")


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
