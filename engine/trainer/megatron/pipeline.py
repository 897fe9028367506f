"""Pipeline parallelism (PP > 1) for the Megatron backend: Megatron-core's 1F1B schedule over p2p.

The ranks of one pipeline (one DP replica's TP group at each of the p stages) are given the same rows.
For a list of K micro-batches, each is packed (`inputs.pack_batch`) to its own [b_k, S_k] — the config's
`variable_seq_lengths` makes the schedule send each activation's shape ahead of it, as verl runs it, so token-
budget micro-batches (`use_dynamic_bsz`) of different shapes pass the pipeline without being padded to the
largest. Megatron's all-gather MoE dispatcher (CPU; cuda with ep = 1) takes no variable shapes: there every
micro-batch is padded to one [b, S] (with ep > 1 on CPU the max over the world: every EP rank needs the same
shape) —, then `get_forward_backward_func()` runs the non-interleaved 1F1B schedule: stage 0 embeds, every stage
runs its layers and sends activations to the next stage (isend/irecv over the pipeline group: gloo on
CPU, NCCL on GPU), the last stage computes the vocab-parallel log-probs and calls `head(k, lp, entropy)`,
which returns micro-batch k's loss L_k (the backward pass then flows back through the stages).

The schedule divides each returned loss by K (Megatron's average over micro-batches); `run` multiplies
by K first, so what is backpropagated is exactly `head`'s loss, as in the PP = 1 loop of `backend`.
Only the last stage sees log-probs and metrics; `broadcast_from_last` hands a tensor or a picklable
object to the other stages of the same pipeline.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch
import torch.distributed as dist

from engine.trainer.base import TrainBatch
from engine.trainer.batch import is_filler, pad_to, plan_micro_batches, trim_padding
from engine.trainer.megatron.inputs import MegatronInputs, pack_batch

Head = Callable[[int, torch.Tensor, "torch.Tensor | None"], torch.Tensor]


def is_last_stage() -> bool:
    from megatron.core import parallel_state as ps

    return ps.is_pipeline_last_stage()


def _last_rank() -> int:
    from megatron.core import parallel_state as ps

    return ps.get_pipeline_model_parallel_last_rank()


def broadcast_from_last(tensor: torch.Tensor) -> torch.Tensor:
    """The last stage's `tensor` on every stage of this pipeline (others pass a buffer of the same shape)."""
    from megatron.core import parallel_state as ps

    tensor = tensor.contiguous()
    dist.broadcast(tensor, src=_last_rank(), group=ps.get_pipeline_model_parallel_group())
    return tensor


def broadcast_object_from_last(obj: Any) -> Any:
    """The last stage's picklable `obj` on every stage of this pipeline."""
    from megatron.core import parallel_state as ps

    box = [obj]
    dist.broadcast_object_list(box, src=_last_rank(), group=ps.get_pipeline_model_parallel_group())
    return box[0]


def pack_uniform(micros: list[TrainBatch], multiple_of: int,
                 max_over_world: Callable[[tuple[int, int]], tuple[int, int]] | None) -> list[MegatronInputs]:
    """Pack each micro-batch and pad all to one [b, S] (the max, over the world when `max_over_world`)."""
    packed = [pack_batch(m, multiple_of=multiple_of) for m in micros]
    shape = (max(p.shape[0] for p in packed), max(p.shape[1] for p in packed))
    if max_over_world is not None:
        shape = max_over_world(shape)
    return [p.pad_to(*shape) for p in packed]


def run(backend: Any, micros: list[TrainBatch], head: Head, *, with_entropy: bool, forward_only: bool,
        aux: tuple[list[float], Any] | None = None) -> None:
    """Run the 1F1B schedule over `micros` (already on the backend's device and trimmed); see the module
    docstring. `backend`: a `MegatronTrainerBackend` (its `ddp`, `layout`, `arch`, `temperature`). `aux`: the
    MoE auxiliary losses' gradient scale per micro-batch and their meter (`moe_aux`; 0 = a filler's)."""
    from engine.trainer.megatron import moe_aux

    from megatron.core.pipeline_parallel import get_forward_backward_func

    if not backend.model.config.variable_seq_lengths:
        uniform = backend._max_shape_over_world if backend._uniform_shapes else None
        inputs = pack_uniform(micros, backend.layout.tp, uniform)
    else:
        inputs = [pack_batch(m, multiple_of=backend.layout.tp) for m in micros]
    inputs = [i.to(backend.device) for i in inputs]
    n = len(inputs)
    rows, seq = inputs[0].shape  # the schedule's nominal shape; each activation's own is sent ahead of it
    order = iter(range(n))

    def loss_func(k: int, logits: torch.Tensor) -> tuple[torch.Tensor, dict]:
        micro = micros[k]
        real = micro.responses.shape[0]
        lp, ent = backend.head_log_probs(logits[:real], inputs[k].response_index[:real], micro.responses,
                                         with_entropy)
        return head(k, lp, ent) * n, {}

    def forward_step(_: Any, model: torch.nn.Module) -> tuple[torch.Tensor, Callable]:
        k = next(order)
        inp = inputs[k]
        if aux is None:
            return model(inp.tokens, inp.position_ids, inp.attention_mask), partial(loss_func, k)
        scales, meter = aux
        with moe_aux.scaled(scales[k]):
            out = model(inp.tokens, inp.position_ids, inp.attention_mask, **backend._router_mask(inp))
        if meter is not None:
            meter.take(scales[k] > 0)
        return out, partial(loss_func, k)

    get_forward_backward_func()(
        forward_step_func=forward_step, data_iterator=None, model=[backend.ddp], num_microbatches=n,
        seq_length=seq, micro_batch_size=rows, forward_only=forward_only)


def compute_log_probs(backend: Any, batch: TrainBatch, with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`MegatronTrainerBackend.compute_log_probs` for PP > 1: computed on the last stage, then broadcast to
    the other stages of the pipeline, so every rank of the DP replica returns the same [B, R]."""
    micros, order = plan_micro_batches(batch, backend.micro_batch_size, backend.log_prob_budget,
                                       backend._max_over_world)
    steps = backend._max_over_world(len(micros))
    trimmed = [trim_padding(micros[min(k, len(micros) - 1)]) for k in range(steps)]
    lps: list[torch.Tensor] = []
    ents: list[torch.Tensor] = []

    def head(k: int, lp: torch.Tensor, ent: torch.Tensor | None) -> torch.Tensor:
        if k < len(micros):
            lps.append(pad_to(lp, trimmed[k][1]).float())
            if ent is not None:
                ents.append(pad_to(ent, trimmed[k][1]).float())
        return lp.sum() * 0.0

    with torch.no_grad():
        run(backend, [backend._to_device(m) for m, _ in trimmed], head, with_entropy=with_entropy,
            forward_only=True)
    mask = batch.response_mask.to(torch.float32)
    if is_filler(batch):
        return mask[:0], (mask[:0] if with_entropy else None)
    last = is_last_stage()
    empty = torch.empty(mask.shape, dtype=torch.float32, device=backend.device)
    lp = broadcast_from_last(torch.cat(lps) if last else empty).cpu()
    ent = broadcast_from_last(torch.cat(ents) if last else empty.clone()).cpu() if with_entropy else None
    if order is not None:  # token-budget micro-batches hold the rows in `order`: back to row order
        inverse = torch.argsort(torch.tensor(order, dtype=torch.long))
        lp, ent = lp[inverse], (ent[inverse] if ent is not None else None)
    return lp * mask, (ent * mask if ent is not None else None)


def accumulate(backend: Any, micros: list[TrainBatch], weights: list[float], reals: list[bool],
               loss_fn: Any, sums: dict[str, float], *, with_entropy: bool, entropy_grad: bool,
               aux: tuple[list[float], Any] | None = None) -> None:
    """The backward passes of one optimizer update for PP > 1 (the PP = 1 loop of `backend._update`):
    micro-batch k backpropagates weights[k] · dp · L_k; a non-real one the same graph times 0. Metric sums
    accumulate into `sums` on the last stage only."""

    def head(k: int, lp: torch.Tensor, ent: torch.Tensor | None) -> torch.Tensor:
        if ent is not None and not entropy_grad:
            ent = ent.detach()
        if not reals[k]:
            return lp.sum() * 0.0 + (ent.sum() * 0.0 if ent is not None else 0.0)
        loss, metrics = loss_fn(lp, ent, micros[k])
        sums["actor/loss"] += weights[k] * float(loss.detach())
        for name, value in metrics.items():
            sums[name] += weights[k] * float(value)
        return loss * (weights[k] * backend.dp_size)

    run(backend, micros, head, with_entropy=with_entropy, forward_only=False, aux=aux)
    if aux is not None and aux[1] is not None:  # what a router recomputed inside the backward recorded
        aux[1].take(True, count=False)
