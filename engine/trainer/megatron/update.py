"""One optimizer update of `MegatronTrainerBackend` (its module docstring's `train_step`): the mini-batch's
micro-batches b_k with mass m_k, each rank backpropagating (m_k / Σ_all ranks m) · dp · cp · L_k (Megatron DDP
averages over dp × cp), every rank running the same number of micro-batches (a filler repeats the last one with
weight 0), then `finalize_model_grads` and the optimizer step. With pp > 1 the backward passes run through
`pipeline.accumulate`. The MoE router's auxiliary losses are scaled and metered per micro-batch (`moe_aux`)."""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from engine.trainer.base import LossFn, TrainBatch
from engine.trainer.batch import is_filler, plan_micro_batches, trim_padding
from engine.trainer.megatron import moe_aux, pipeline
from engine.trainer.step_metrics import update_metrics


def token_mass(micro: TrainBatch) -> float:
    """Default micro-batch mass: its number of response tokens."""
    return float(micro.response_mask.sum())


def optimizer_update(backend: Any, batch: TrainBatch, loss_fn: LossFn, real: bool = True) -> dict[str, float]:
    """One optimizer update of `backend` (a `MegatronTrainerBackend`) over the mini-batch `batch`; `real=False`:
    this rank only joins the collectives, with weight 0."""
    from megatron.core.distributed import finalize_model_grads

    backend.ddp.train()
    micros, _ = plan_micro_batches(batch, backend.micro_batch_size, backend.update_budget, backend._max_over_world)
    mass_fn: Callable[[TrainBatch], float] = batch.meta.get("micro_weight_fn") or token_mass
    has_rows = real and not is_filler(batch)  # a rank without rows of its own steps through with weight 0
    masses = [float(mass_fn(m)) if has_rows else 0.0 for m in micros]
    (total_mass,) = backend._sum_over_dp([sum(masses)])
    steps = backend._max_over_world(len(micros))
    needs_entropy = bool(getattr(loss_fn, "needs_entropy", False))
    with_entropy = needs_entropy or backend.entropy_mode != "none"
    entropy_grad = needs_entropy or backend.entropy_mode == "grad"
    backend.ddp.zero_grad_buffer()
    sums: dict[str, float] = defaultdict(float)
    reals = [k < len(micros) and has_rows for k in range(steps)]
    # the router's auxiliary losses: gradient scale cp / K_real per real micro-batch, 0 for a filler (moe_aux)
    aux = [backend.layout.cp / max(1, sum(reals)) * r for r in reals]
    meter = moe_aux.AuxLossMeter(sum(backend.arch.moe_layers)) if backend.aux_losses else None
    if backend.layout.pp > 1:
        pipeline.accumulate(
            backend, [backend._to_device(trim_padding(micros[min(k, len(micros) - 1)])[0]) for k in range(steps)],
            [masses[k] / total_mass if reals[k] and total_mass > 0 else 0.0 for k in range(steps)], reals,
            loss_fn, sums, with_entropy=with_entropy, entropy_grad=entropy_grad, aux=(aux, meter))
    for k in range(steps if backend.layout.pp == 1 else 0):
        real = k < len(micros) and has_rows
        micro, _ = trim_padding(micros[min(k, len(micros) - 1)])
        micro = backend._to_device(micro)
        weight = masses[k] / total_mass if real and total_mass > 0 else 0.0
        with moe_aux.scaled(aux[k]):
            log_probs, entropy = backend._forward(micro, with_entropy)
        if entropy is not None and not entropy_grad:
            entropy = entropy.detach()
        # with overlap_grad_reduce the buckets are reduced in the last micro-batch's backward only
        sync = backend.ddp.no_sync() if k < steps - 1 else contextlib.nullcontext()
        if not real:  # the same graph (and collectives) backpropagated with weight 0; nothing observed
            with sync, moe_aux.scaled(0.0):
                (log_probs.sum() * 0.0 + (entropy.sum() * 0.0 if entropy is not None else 0.0)).backward()
            if meter is not None:
                meter.take(False)
            continue
        loss, metrics = loss_fn(log_probs, entropy, micro)
        with sync, moe_aux.scaled(aux[k]):  # a recomputed router runs inside the backward
            (loss * (weight * backend.dp_size * backend.layout.cp)).backward()  # DDP averages over dp × cp
        if meter is not None:
            meter.take(True)
        sums["actor/loss"] += weight * float(loss.detach())
        for name, value in metrics.items():
            sums[name] += weight * float(value)
    finalize_model_grads([backend.ddp])
    lr = backend.current_lr()
    grad_norm, applied = (0.0, False) if total_mass <= 0 else backend.optimizer.step(lr)
    skipped = not applied
    if not skipped:
        backend.global_step += 1
    backend.ddp.zero_grad_buffer()
    names = backend._names_over_dp(sums)
    out = dict(zip(names, backend._sum_over_dp([sums[n] for n in names])))
    if backend.layout.pp > 1:  # the loss and its metrics live on the last stage
        out = pipeline.broadcast_object_from_last(out)
    if meter is not None:
        out.update(meter.metrics(backend.device))
    out.update(update_metrics(grad_norm, lr, skipped, steps))
    return out

