"""Train-step time of the two trainer backends on one batch, with the GRPO loss the runtime uses.

For each backend: the log-prob pass (π_θ of the rollout tokens), `steps` optimizer steps (median of all but
the first, which pays kernel selection / allocator warm-up), trainer tokens/s = non-padding tokens / step
time, and the rollout↔trainer mismatch on the untrained weights (`rollout_corr/kl` = mean over response
tokens of log q_rollout − log π_θ, plus the mean |Δ|). For Megatron also the proximal-snapshot costs
(`snapshot_params`, the swap in/out around the π_prox forward) and the HF-named bucket export.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import torch

from engine.algo.loss import GRPOLoss
from engine.algo.rc_diagnostics import offpolicy_metrics
from engine.trainer.base import TrainBatch, TrainerBackend
from gpucheck.batches import batch_tokens
from gpucheck.report import cuda_sync, peak_gib_and_reset

OPTIM = {"lr": 1e-6, "betas": [0.9, 0.999], "weight_decay": 0.0}


def _mismatch(trainer_lp: torch.Tensor, batch: TrainBatch) -> dict[str, float]:
    mask = batch.response_mask.float()
    m = offpolicy_metrics(trainer_lp.float(), batch.rollout_log_probs.float(), mask)
    diff = ((trainer_lp - batch.rollout_log_probs).abs() * mask).sum() / mask.sum()
    return {"rollout_corr_kl": m["kl"], "mean_abs_logprob_diff": float(diff)}


def _timed(fn: Any) -> tuple[Any, float]:
    cuda_sync()
    start = time.perf_counter()
    out = fn()
    cuda_sync()
    return out, time.perf_counter() - start


def _steps(backend: TrainerBackend, batch: TrainBatch, steps: int) -> dict[str, Any]:
    loss_fn = GRPOLoss()
    times, metrics = [], {}
    for _ in range(steps):
        metrics, seconds = _timed(lambda: backend.train_step(batch, loss_fn))
        times.append(seconds)
    step_s = statistics.median(times[1:]) if len(times) > 1 else times[0]
    return {
        "rows": len(batch),
        "tokens_per_step": batch_tokens(batch),
        "first_step_s": round(times[0], 3),
        "step_s": round(step_s, 3),
        "tokens_per_s": round(batch_tokens(batch) / step_s, 1),
        "grad_norm": metrics.get("actor/grad_norm"),
        "skipped_step": metrics.get("actor/skipped_step"),
        "loss": metrics.get("actor/loss"),
    }


def torch_trainer(
    model: torch.nn.Module,
    batch: TrainBatch,
    device: str,
    micro: int,
    steps: int,
    bucket_bytes: int,
    host_sync: bool = True,
) -> dict[str, Any]:
    """`TorchTrainerBackend` (one process, AdamW on the model's own dtype), then (`host_sync`) the host sync
    round trip."""
    from engine.trainer.torch_trainer import TorchTrainerBackend

    peak_gib_and_reset()
    backend = TorchTrainerBackend(
        model, optim_cfg=OPTIM, grad_clip=1.0, micro_batch_size=micro, temperature=1.0, device=device
    )
    (lp, _), lp_s = _timed(lambda: backend.compute_log_probs(batch))
    out: dict[str, Any] = {"micro_batch": micro, "log_prob_pass_s": round(lp_s, 3), **_mismatch(lp, batch)}
    out.update(_steps(backend, batch, steps))
    if host_sync:
        out.update(_host_round_trip(backend, bucket_bytes))
    out["peak_gpu_gib"] = peak_gib_and_reset()
    return out


def _host_round_trip(backend: Any, bucket_bytes: int) -> dict[str, Any]:
    """The object-store sync path without Ray: `export_weights` (device → HF-named numpy buckets, bf16
    widened to fp32) and `load_buckets_into` (numpy → device), here back into the trainer's own model."""
    from engine.sync.apply import load_buckets_into

    buckets, export_s = _timed(lambda: list(backend.export_weights(bucket_bytes)))
    nbytes = sum(int(a.nbytes) for b in buckets for a in b.values())
    _, load_s = _timed(lambda: load_buckets_into(backend.model, buckets))
    return {
        "export_buckets": len(buckets),
        "export_gib_fp32": round(nbytes / 2**30, 2),
        "export_s": round(export_s, 2),
        "export_gb_per_s": round(nbytes / 1e9 / export_s, 2),
        "host_load_s": round(load_s, 2),
        "host_load_gb_per_s": round(nbytes / 1e9 / load_s, 2),
    }


def megatron_trainer(
    hf_dir: Path, batch: TrainBatch, dtype: str, micro: int, steps: int, bucket_bytes: int
) -> dict[str, Any]:
    """`MegatronTrainerBackend` at TP=1 (distributed optimizer on GPU, AdamW on `main_grad` on CPU)."""
    from engine.trainer.megatron.backend import MegatronTrainerBackend

    peak_gib_and_reset()
    backend, build_s = _timed(
        lambda: MegatronTrainerBackend(
            str(hf_dir),
            tp=1,
            micro_batch_size=micro,
            temperature=1.0,
            dtype=dtype,
            optim_cfg=OPTIM,
            grad_clip=1.0,
        )
    )
    (lp, _), lp_s = _timed(lambda: backend.compute_log_probs(batch))
    out: dict[str, Any] = {
        "backend": repr(backend),
        "micro_batch": micro,
        "build_and_load_s": round(build_s, 2),
        "log_prob_pass_s": round(lp_s, 3),
        **_mismatch(lp, batch),
    }
    _, snap_s = _timed(backend.snapshot_params)
    prox, prox_s = _timed(lambda: backend.proximal_log_probs(batch))
    out.update(
        {
            "snapshot_s": round(snap_s, 3),
            "snapshot_gib": round(backend.snapshot.nbytes / 2**30, 2),
            "prox_log_probs_s": round(prox_s, 3),
            "prox_swap_s": round(backend.extra_metrics.get("timing_s/prox_swap", float("nan")), 3),
            "prox_equals_live": bool(torch.equal(prox, lp)),
        }
    )
    out.update(_steps(backend, batch, steps))
    buckets, export_s = _timed(lambda: list(backend.export_weights(bucket_bytes)))
    nbytes = sum(int(a.nbytes) for b in buckets for a in b.values())
    out.update(
        {
            "export_buckets": len(buckets),
            "export_gib_fp32": round(nbytes / 2**30, 2),
            "export_s": round(export_s, 2),
            "export_gb_per_s": round(nbytes / 1e9 / export_s, 2),
            "peak_gpu_gib": peak_gib_and_reset(),
        }
    )
    return out
