"""The MoE router's auxiliary losses (`trainer.moe_aux_loss_coeff` with `moe_router_load_balancing_type`,
`trainer.moe_z_loss_coeff`): their gradient scale per micro-batch and their metrics.

Megatron's router adds each auxiliary loss a to the graph through `MoEAuxLossAutoScaler` (identity forward; the
backward adds ∂a/∂θ · s), with one class-wide scale s that Megatron's schedule sets to cp / K (K micro-batches).
The backend weights its micro-batches itself (a filler micro-batch, which only keeps the ranks in lockstep, has
weight 0), so s is taken per micro-batch instead: `install()` makes the autoscaler capture the scale current at
its forward (`scaled(s)`), and the backend runs micro-batch k under s_k = cp / K_real for a real one (K_real:
this rank's real micro-batches of the update) and 0 for a filler. With the DDP average over dp × cp that is
Megatron's (and verl's) gradient: ∇ mean over micro-batches and data-parallel ranks of Σ_layers coeff · a.
Full activation recompute re-runs the router inside the backward, so the backend keeps s set there too
(pp = 1; with pp > 1 the schedule's backward runs outside, and a recomputed router takes Megatron's cp / K).

Metrics (verl logs none for Megatron's router; these are Megatron's own names): `actor/load_balancing_loss`
(or `actor/seq_load_balancing_loss`) and `actor/z_loss`: the unscaled loss per MoE layer (Megatron's tracker,
`save_to_aux_losses_tracker`), summed over the TP × CP group for the load-balancing losses (each rank holds a
partial sum over its tokens) and averaged over it for the z-loss (a per-token mean), then averaged over the real
micro-batches of all data-parallel ranks and over the MoE layers (Megatron's `track_moe_metrics`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.distributed as dist

_SCALE: list[float | None] = [None]
_NAMES = {"load_balancing_loss": "actor/load_balancing_loss", "seq_load_balancing_loss":
          "actor/seq_load_balancing_loss", "z_loss": "actor/z_loss"}


def install() -> None:
    """Make `MoEAuxLossAutoScaler` use the scale current at its forward when one is set (idempotent)."""
    from megatron.core.transformer.moe.moe_utils import MoEAuxLossAutoScaler as Scaler

    if getattr(Scaler, "_asyncrl_per_forward", False):
        return
    forward, backward = Scaler.forward, Scaler.backward

    def scaled_forward(ctx, output: torch.Tensor, aux_loss: torch.Tensor) -> torch.Tensor:
        ctx.asyncrl_scale = _SCALE[0]
        return forward(ctx, output, aux_loss)

    def scaled_backward(ctx, grad_output: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        grad, aux_grad = backward(ctx, grad_output)
        scale = getattr(ctx, "asyncrl_scale", None)
        return grad, (aux_grad if scale is None else torch.full_like(aux_grad, scale))

    Scaler.forward, Scaler.backward = staticmethod(scaled_forward), staticmethod(scaled_backward)
    Scaler._asyncrl_per_forward = True


@contextlib.contextmanager
def scaled(scale: float) -> Iterator[None]:
    """Auxiliary losses attached inside this block get gradient scale `scale`."""
    previous, _SCALE[0] = _SCALE[0], float(scale)
    try:
        yield
    finally:
        _SCALE[0] = previous


class AuxLossMeter:
    """Accumulates Megatron's per-layer auxiliary-loss tracker over an update's real micro-batches."""

    def __init__(self, num_moe_layers: int) -> None:
        self.num_moe_layers = max(1, num_moe_layers)
        self.sums: dict[str, torch.Tensor] = {}
        self.groups: dict[str, object] = {}
        self.real = 0

    def take(self, real: bool, count: bool = True) -> None:
        """Move what the tracker holds into the sums (a filler micro-batch's values are dropped); `count`:
        it was one micro-batch."""
        from megatron.core.transformer.moe.moe_utils import get_moe_layer_wise_logging_tracker

        for name, entry in get_moe_layer_wise_logging_tracker().items():
            values = entry["values"]
            if real:
                self.sums[name] = self.sums.get(name, torch.zeros_like(values)) + values.detach()
                self.groups[name] = entry.get("reduce_group")
            values.zero_()
        self.real += int(real and count)

    def metrics(self, device: torch.device) -> dict[str, float]:
        """Collective over the world (every rank calls it, with the same tracker names): the metrics of the
        module docstring."""
        from megatron.core import parallel_state as ps

        out: dict[str, float] = {}
        tp_cp = ps.get_tensor_and_context_parallel_group()
        dp = ps.get_data_parallel_group()
        count = torch.tensor([float(self.real)], device=device)
        if ps.get_data_parallel_world_size() > 1:
            dist.all_reduce(count, group=dp)
        for name in sorted(_NAMES):
            if not self._anyone_has(name, device):
                continue
            values = self.sums.get(name)
            if values is None:
                values = torch.zeros(0, device=device)
            values = self._layers(values, device)
            if ps.get_pipeline_model_parallel_world_size() > 1:
                dist.all_reduce(values, group=ps.get_pipeline_model_parallel_group())
            if dist.get_world_size(tp_cp) > 1:
                dist.all_reduce(values, group=tp_cp)
                if name == "z_loss":
                    values /= dist.get_world_size(tp_cp)
            if ps.get_data_parallel_world_size() > 1:
                dist.all_reduce(values, group=dp)
            out[_NAMES[name]] = float(values.sum()) / max(1.0, float(count)) / self.num_moe_layers
        return out

    def _layers(self, values: torch.Tensor, device: torch.device) -> torch.Tensor:
        width = torch.tensor([values.numel()], device=device)
        dist.all_reduce(width, op=dist.ReduceOp.MAX)
        full = torch.zeros(int(width), device=device)
        full[: values.numel()] = values.to(device)
        return full

    def _anyone_has(self, name: str, device: torch.device) -> bool:
        flag = torch.tensor([float(name in self.sums)], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())
