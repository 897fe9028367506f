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

Token-budget micro-batches (`trainer.use_dynamic_bsz`, verl's `rearrange_micro_batches`): a rank's rows of one
mini-batch, with lengths ℓ_i (prompt + response tokens, `attention_mask.sum`), are grouped into micro-batches
whose *padded* cost fits the budget:

    cost(g) = |g| · max_{i∈g} ℓ_i ≤ budget      (every row of a micro-batch is padded to its longest)

because that — not Σ ℓ_i — is what the forward computes on and what the memory model's T counts (verl counts
real tokens of packed rows; asyncrl's rows are padded, so counting Σ ℓ_i let one long row in a group of short ones
multiply the real activation and log-prob-head memory). k = the fewest such groups (never more than the rows; a
row longer than the budget is its own micro-batch — `validate` refuses such configs): the rows sorted by
length, cut greedily into consecutive runs (optimal for this cost). The data-parallel ranks agree on the largest
k of any rank (verl's `same_micro_num_in_dp`), then each cuts its own rows into that many runs with the least
largest cost. Micro-batches are ordered heaviest first (Σ ℓ_i², the attention cost, as verl's
`use_dynamic_bsz_balance`), rows within one keep their batch order; callers map results back to row order.
`ppo_max_token_len_per_gpu` is a bound on padded tokens, not a target. (`balanced_partitions`, Karmarkar–Karp,
still balances the data-parallel shards' token sums: verl's `balance_batch`.)
"""

from __future__ import annotations

import heapq
import itertools

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


def balanced_partitions(weights: list[int], parts: int, *, equal_size: bool = False) -> list[list[int]]:
    """`parts` groups of the indices of `weights` with near-equal sums: the Karmarkar–Karp largest differencing
    method. Every item starts as a partial solution (the item alone in one group, the others empty); the two
    partial solutions of largest spread (max − min group sum) are merged by pairing the heaviest group of one with
    the lightest of the other, until one remains. With `equal_size` the items are first dealt out in rounds of
    `parts` (by descending weight) so every group gets the same number of items (needs `parts` | len(weights)).
    Groups list their indices ascending; the groups are in no particular order."""
    n = len(weights)
    if parts < 1:
        raise ValueError(f"need parts >= 1, got {parts}")
    if equal_size and n % parts:
        raise ValueError(f"equal_size needs parts ({parts}) to divide the item count ({n})")
    order = sorted(range(n), key=lambda i: (-weights[i], i))
    counter = itertools.count()
    heap: list[tuple[int, int, list[tuple[int, list[int]]]]] = []

    def push(groups: list[tuple[int, list[int]]]) -> None:
        groups = sorted(groups, key=lambda g: (-g[0], g[1]))
        heapq.heappush(heap, (-(groups[0][0] - groups[-1][0]), next(counter), groups))

    step = parts if equal_size else 1
    for lo in range(0, n, step):
        chunk = order[lo:lo + step]
        push([(weights[i], [i]) for i in chunk] + [(0, []) for _ in range(parts - len(chunk))])
    if not heap:
        return [[] for _ in range(parts)]
    while len(heap) > 1:
        _, _, a = heapq.heappop(heap)
        _, _, b = heapq.heappop(heap)
        # a and b are sorted heaviest first: pair a's heaviest with b's lightest
        push([(wa + wb, ia + ib) for (wa, ia), (wb, ib) in zip(a, reversed(b))])
    return [sorted(idx) for _, idx in heap[0][2]]


def padded_tokens(lengths: list[int], group: list[int]) -> int:
    """What micro-batch `group` costs once padded to its longest row: |group| × max ℓ (the tokens the forward
    really computes on; the module docstring)."""
    return len(group) * max((lengths[i] for i in group), default=0)


def _runs(order: list[int], lengths: list[int], budget: int) -> list[list[int]]:
    """`order` (rows by descending length) cut greedily into consecutive runs of padded cost ≤ `budget` (a row
    longer than the budget alone): the fewest runs any partition of these rows can have under that bound."""
    runs: list[list[int]] = []
    for i in order:
        if runs and (len(runs[-1]) + 1) * lengths[runs[-1][0]] <= budget:
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs


def micro_batch_count(lengths: list[int], max_tokens: int) -> int:
    """k of the module docstring: the fewest micro-batches whose padded cost (`padded_tokens`) each fits the
    budget (at most one per row; 1 for no rows)."""
    if max_tokens < 1:
        raise ValueError(f"the token budget must be >= 1, got {max_tokens}")
    if not lengths:
        return 1
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    return len(_runs(order, lengths, max_tokens))


def token_budget_micro_batches(lengths: list[int], count: int) -> list[list[int]]:
    """The row indices of each of min(`count`, rows) micro-batches: the rows by descending length cut into that
    many consecutive runs with the least largest padded cost (the least bound whose greedy cut needs no more runs,
    then the costliest runs halved until there are `count`), heaviest (Σ ℓ²) first, indices ascending within
    each."""
    n = len(lengths)
    if n == 0:
        return []
    count = max(1, min(count, n))
    order = sorted(range(n), key=lambda i: (-lengths[i], i))
    lo, hi = lengths[order[0]], n * lengths[order[0]]
    while lo < hi:  # the least bound that the greedy cut meets with ≤ count runs (bisection: ~log2(n·ℓ) cuts)
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if len(_runs(order, lengths, mid)) <= count else (mid + 1, hi)
    runs = _runs(order, lengths, lo)
    while len(runs) < count:  # halve the costliest run (a part never costs more than its run)
        k = max((r for r in range(len(runs)) if len(runs[r]) > 1), key=lambda r: padded_tokens(lengths, runs[r]))
        run = runs.pop(k)
        runs[k:k] = [run[: len(run) // 2], run[len(run) // 2:]]
    groups = [sorted(r) for r in runs]
    return sorted(groups, key=lambda g: (-sum(lengths[i] ** 2 for i in g), g[0]))


def optimizer_steps_per_local_step(require_batches: int, ppo_epochs: int) -> int:
    """require_batches × ppo_epochs (what `asyncrl/trainer/optimizer_steps` reports when no step is skipped)."""
    return int(require_batches) * int(ppo_epochs)


def combine_update_metrics(updates: list[dict[str, float]]) -> dict[str, float]:
    """The metrics of one local step from those of its optimizer steps: the mean of each value over the steps
    that report it (loss metrics, `actor/grad_norm`, `rollout_corr/*` in bypass mode — verl averages its
    per-mini-batch lists the same way), except `actor/lr` (the last step's), `actor/skipped_step` (the number
    of steps skipped) and `actor/micro_batches` (summed); `asyncrl/trainer/optimizer_steps` counts the steps
    applied and `asyncrl/trainer/micro_batches` the forward/backward micro-batches of all of them (the most of
    any rank: the short ranks repeat one with weight 0)."""
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
    out["asyncrl/trainer/micro_batches"] = out.get("actor/micro_batches", 0.0)
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
