"""The metrics every training backend reports for one optimizer update (verl's `actor/*` names), built once.

The loss-weighted sums of the loss function's metrics are reduced by each backend (across its data-parallel
ranks); `update_metrics` adds the per-update scalars both backends share:

    actor/grad_norm        global gradient norm before clipping (0 when the update was skipped before it)
    actor/lr               learning rate the update used
    actor/skipped_step     1 when no optimizer step was taken (no token mass, or a non-finite gradient)
    actor/micro_batches    micro-batches stepped through (the maximum over ranks)
    actor/response_tokens  response tokens of the whole batch (summed over ranks)
    actor/optimizer_step   optimizer steps taken so far
    timing_s/update_actor  wall time of the update, from `start` (a `time.perf_counter()` reading)
"""

from __future__ import annotations

import time


def update_metrics(grad_norm: float, lr: float, skipped: bool, micro_batches: int, response_tokens: float,
                   optimizer_step: int, start: float) -> dict[str, float]:
    """The shared per-update scalars (see the module docstring)."""
    return {
        "actor/grad_norm": grad_norm,
        "actor/lr": lr,
        "actor/skipped_step": float(skipped),
        "actor/micro_batches": float(micro_batches),
        "actor/response_tokens": response_tokens,
        "actor/optimizer_step": float(optimizer_step),
        "timing_s/update_actor": time.perf_counter() - start,
    }
