"""How one local step's batch becomes optimizer steps: verl's mini-batches × `ppo_epochs`.

verl's actor (`update_policy`) splits the batch of a local step into mini-batches of `ppo_mini_batch_size × n`
sequences — `require_batches` of them in the fully-async trainer — and makes `ppo_epochs` passes over them,
one optimizer step per mini-batch:

    optimizer steps per local step = require_batches × ppo_epochs

The PPO ratio of every pass is taken against the same π_old, computed once per local step before the first
pass (π_rollout in bypass mode, π_prox in decoupled mode), as in verl.

`mini_batch_plan` is the one place both trainer backends (torch/FSDP2 and Megatron) get the split from. A
backend rank calls it with its own rows: every rank gets the same number of mini-batches (so the collectives
of each optimizer step line up) and rank r's mini-batch k is its share of the global mini-batch k. Rows are
split into `num_mini_batches` contiguous, near-equal chunks (the first `rows % k` chunks one row longer;
with fewer rows than mini-batches the last chunks are empty — the backend then steps with weight 0). Counting
mini-batches instead of rows keeps the number of optimizer steps per local step fixed when the batch is
smaller than nominal (stale groups dropped, `skip_zero_advantage`).

Order: verl's default (`actor.shuffle = false`, and its FSDP actor never shuffles) is the same consecutive
split in every epoch; with `shuffle` the rows are permuted anew before each epoch by a generator seeded from
(`seed`, `step`, epoch), so a resumed run (same optimizer step count) draws the same permutation.
"""

from __future__ import annotations

import numpy as np


def contiguous_bounds(rows: int, parts: int) -> list[tuple[int, int]]:
    """`parts` contiguous `[lo, hi)` ranges covering `range(rows)` in order, sizes as equal as possible: the
    first `rows % parts` ranges get one row more (with fewer rows than parts the last ranges are empty)."""
    base, extra = divmod(rows, parts)
    bounds, lo = [], 0
    for k in range(parts):
        hi = lo + base + (1 if k < extra else 0)
        bounds.append((lo, hi))
        lo = hi
    return bounds


def mini_batch_plan(num_rows: int, num_mini_batches: int, epochs: int = 1, *, shuffle: bool = False,
                    seed: int = 0, step: int = 0) -> list[list[list[int]]]:
    """`plan[e][k]`: the row indices of mini-batch k in epoch e (see the module docstring).

    Every epoch lists `num_mini_batches` mini-batches that together hold each of `range(num_rows)` exactly once.
    """
    if num_mini_batches < 1 or epochs < 1 or num_rows < 0:
        raise ValueError(f"need num_mini_batches >= 1, epochs >= 1 and num_rows >= 0, got {num_mini_batches}, "
                         f"{epochs}, {num_rows}")
    bounds = contiguous_bounds(num_rows, num_mini_batches)
    plan: list[list[list[int]]] = []
    for epoch in range(epochs):
        order = list(range(num_rows))
        if shuffle:
            rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, int(step), epoch])
            order = [int(i) for i in rng.permutation(num_rows)]
        plan.append([order[a:b] for a, b in bounds])
    return plan


def optimizer_steps_per_local_step(require_batches: int, ppo_epochs: int) -> int:
    """require_batches × ppo_epochs (what `asyncrl/trainer/optimizer_steps` reports when no step is skipped)."""
    return int(require_batches) * int(ppo_epochs)


def combine_update_metrics(updates: list[dict[str, float]]) -> dict[str, float]:
    """The metrics of one local step from those of its optimizer steps: the mean of each value over the steps
    that report it (loss metrics, `actor/grad_norm`, `rollout_corr/*` in bypass mode — verl averages its
    per-mini-batch lists the same way), except `actor/lr` (the last step's), `actor/skipped_step` (the number
    of steps skipped) and `actor/micro_batches` (summed); `asyncrl/trainer/optimizer_steps` counts the steps
    applied."""
    out: dict[str, float] = {}
    if not updates:
        return {"asyncrl/trainer/optimizer_steps": 0.0}
    names = {n for u in updates for n in u}
    for name in names:
        values = [float(u[name]) for u in updates if name in u]
        if name in ("actor/skipped_step", "actor/micro_batches"):
            out[name] = float(sum(values))
        elif name == "actor/lr":
            out[name] = values[-1]
        else:
            out[name] = sum(values) / len(values)
    out["asyncrl/trainer/optimizer_steps"] = float(len(updates) - out.get("actor/skipped_step", 0.0))
    return out


def local_step_metrics(updates: list[dict[str, float]], response_tokens: float, optimizer_step: int,
                       seconds: float, extra: dict[str, float]) -> dict[str, float]:
    """A backend's `train_step` result: `combine_update_metrics(updates)` plus `actor/response_tokens` (Σ over
    the data-parallel ranks), `actor/optimizer_step` (optimizer steps so far), `timing_s/update_actor` and the
    backend's `extra` metrics of the step."""
    out = combine_update_metrics(updates)
    out["actor/response_tokens"] = float(response_tokens)
    out["actor/optimizer_step"] = float(optimizer_step)
    out["timing_s/update_actor"] = seconds
    out.update(extra)
    return out
