"""The metrics every training backend reports for one optimizer update (verl's `actor/*` names), built once.

The loss-weighted sums of the loss function's metrics are reduced by each backend (across its data-parallel
ranks); `update_metrics` adds the per-update scalars both backends share:

    actor/grad_norm        global gradient norm before clipping (0 when the update was skipped before it)
    actor/lr               learning rate the update used
    actor/skipped_step     1 when no optimizer step was taken (no token mass, or a non-finite gradient)
    actor/micro_batches    micro-batches stepped through (the maximum over ranks)

A local step's record combines its mini-batch updates (`engine.trainer.minibatch.combine_update_metrics`).
"""

from __future__ import annotations


def update_metrics(grad_norm: float, lr: float, skipped: bool, micro_batches: int) -> dict[str, float]:
    """The shared per-update scalars (see the module docstring)."""
    return {
        "actor/grad_norm": grad_norm,
        "actor/lr": lr,
        "actor/skipped_step": float(skipped),
        "actor/micro_batches": float(micro_batches),
    }
