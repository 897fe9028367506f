"""From trajectory groups to the padded `TrainBatch` the trainer consumes, and micro-batch splitting.

Row layout (one row per trajectory), with P = longest prompt and R = longest response of the batch:

    input_ids      = [pad … pad, prompt | response, pad … pad]          shape [B, P + R]
    attention_mask = [0 … 0,     1 … 1  | 1 … 1,    0 … 0]
    position_ids   = clamp(cumsum(attention_mask) − 1, 0)
    response_mask  = 1 on the real response tokens (EOS included: responses end at their first EOS), else 0;
                     × the trajectory's `loss_mask` in a multi-turn run (tool answers are 0)

`rollout_log_probs` is aligned with `responses` (0 on padding). The response mask is built from the
response *lengths*, never from `!= pad`, so a pad id equal to the EOS id still counts the EOS.

Images: when any prompt has images (`Prompt.images`), `meta["images"]` is the per-row list of each row's
images (a tuple of base64 strings, empty for text rows), so row selection and micro-batching carry them;
the trainer turns them into pixel values with the model's image processor. A prompt with images is never
truncated (`max_prompt_len` would cut its vision tokens): it raises instead.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from engine.trainer.base import TrainBatch
from engine.trainer.packed_rows import Layout, packed_micro_batch_count, packed_micro_batches
from engine.trainer.minibatch import (
    balanced_partitions,
    contiguous_bounds,
    micro_batch_count,
    token_budget_micro_batches,
)
from engine.types import Trajectory, TrajectoryGroup

Row = tuple[list[int], Trajectory] | tuple[list[int], Trajectory, Sequence[str]]
"""A prompt's token ids with one of its trajectories (and the prompt's images, if any)."""


def _rows(items: Sequence[TrajectoryGroup | Row]) -> tuple[list[tuple[list[int], Trajectory]], list[int], list[str],
                                                           list[tuple[str, ...]]]:
    rows: list[tuple[list[int], Trajectory]] = []
    group_index: list[int] = []
    uids: list[str] = []
    images: list[tuple[str, ...]] = []
    for g, item in enumerate(items):
        if isinstance(item, TrajectoryGroup):
            for traj in item.trajectories:
                rows.append((item.prompt.prompt_ids, traj))
                group_index.append(g)
                uids.append(item.prompt.uid)
                images.append(tuple(item.prompt.images))
        else:
            prompt_ids, traj = item[0], item[1]
            rows.append((list(prompt_ids), traj))
            group_index.append(g)
            uids.append(str(g))
            images.append(tuple(item[2]) if len(item) > 2 else ())  # type: ignore[misc]
    return rows, group_index, uids, images


def collate(
    items: Sequence[TrajectoryGroup | Row],
    pad_token_id: int,
    max_prompt_len: int | None = None,
    max_response_len: int | None = None,
) -> TrainBatch:
    """Pad trajectories into a `TrainBatch` (see the module docstring for the layout).

    `items` are `TrajectoryGroup`s (each contributes one row per trajectory, in order) or `(prompt_ids,
    trajectory[, images])` rows (each its own group). Prompts longer than `max_prompt_len` keep their *last* tokens;
    responses longer than `max_response_len` keep their first. `meta` carries per-row lists aligned with
    the rows: `group_index` (long tensor, which item a row came from), `uids`, `rewards` (float tensor),
    `min_versions`, `max_versions` (long tensors) and `finish_reasons` — and `images` when any row has some.
    """
    rows, group_index, uids, images = _rows(items)
    if not rows:
        raise ValueError("collate needs at least one trajectory")
    if max_prompt_len and any(imgs and len(p) > max_prompt_len for (p, _), imgs in zip(rows, images)):
        raise ValueError(f"a prompt with images is longer than max_prompt_len = {max_prompt_len}: truncating it "
                         "would cut its vision tokens")
    prompts = [p[-max_prompt_len:] if max_prompt_len else list(p) for p, _ in rows]
    responses = [t.response_ids[:max_response_len] if max_response_len else list(t.response_ids) for _, t in rows]
    log_probs = [t.rollout_log_probs[: len(r)] for (_, t), r in zip(rows, responses)]
    if any(len(lp) != len(r) for lp, r in zip(log_probs, responses)):
        raise ValueError("every response token needs a rollout log-prob")
    if any(not p for p in prompts):
        raise ValueError("empty prompt")
    n, p_len, r_len = len(rows), max(len(p) for p in prompts), max(max(len(r) for r in responses), 1)
    input_ids = torch.full((n, p_len + r_len), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((n, p_len + r_len), dtype=torch.long)
    rollout_log_probs = torch.zeros((n, r_len), dtype=torch.float32)
    for i, (prompt, response, lp) in enumerate(zip(prompts, responses, log_probs)):
        input_ids[i, p_len - len(prompt) : p_len] = torch.tensor(prompt, dtype=torch.long)
        attention_mask[i, p_len - len(prompt) : p_len + len(response)] = 1
        if response:
            input_ids[i, p_len : p_len + len(response)] = torch.tensor(response, dtype=torch.long)
            rollout_log_probs[i, : len(response)] = torch.tensor(lp, dtype=torch.float32)
    response_mask = attention_mask[:, p_len:].to(torch.float32)
    for i, ((_, t), response) in enumerate(zip(rows, responses)):
        if t.loss_mask is not None:  # multi-turn: the tools' tokens are context, not the model's actions
            response_mask[i, : len(response)] *= torch.tensor(t.loss_mask[: len(response)], dtype=torch.float32)
    trajs = [t for _, t in rows]
    meta: dict = {
        "group_index": torch.tensor(group_index, dtype=torch.long),
        "uids": uids,
        "rewards": torch.tensor([t.reward for t in trajs], dtype=torch.float32),
        "min_versions": torch.tensor([t.min_version for t in trajs], dtype=torch.long),
        "max_versions": torch.tensor([t.max_version for t in trajs], dtype=torch.long),
        "finish_reasons": [t.finish_reason for t in trajs],
    }
    if any(images):
        meta["images"] = images
    return TrainBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=(attention_mask.cumsum(-1) - 1).clamp(min=0),
        responses=input_ids[:, p_len:].clone(),
        response_mask=response_mask,
        rollout_log_probs=rollout_log_probs,
        meta=meta,
    )


def split_micro_batches(batch: TrainBatch, micro_size: int) -> list[TrainBatch]:
    """Consecutive row slices of at most `micro_size` rows (the last may be smaller); meta is shared."""
    if micro_size < 1:
        raise ValueError("micro_size must be >= 1")
    return [batch.select(slice(lo, lo + micro_size)) for lo in range(0, len(batch), micro_size)]


def row_lengths(batch: TrainBatch) -> list[int]:
    """Real tokens (prompt + response) of each row: what a token budget counts (verl's `attention_mask.sum`)."""
    return [int(n) for n in batch.attention_mask.sum(-1).tolist()]


def split_by_token_budget(batch: TrainBatch, count: int, packing: Layout | None = None
                          ) -> tuple[list[TrainBatch], list[int]]:
    """`batch` as min(`count`, rows) token-balanced micro-batches (`engine.trainer.minibatch`'s
    `token_budget_micro_batches`; `packed_rows.packed_micro_batches` with `packing`), and the row order they hold
    when concatenated (to map outputs back)."""
    lengths = row_lengths(batch)
    groups = packed_micro_batches(lengths, count, packing) if packing else token_budget_micro_batches(lengths, count)
    return [batch.select(torch.tensor(g, dtype=torch.long)) for g in groups], [i for g in groups for i in g]


def plan_micro_batches(batch: TrainBatch, micro_size: int, max_tokens: int | None,
                       agree: Callable[[int], int], packing: Layout | None = None
                       ) -> tuple[list[TrainBatch], list[int] | None]:
    """A rank's micro-batches of `batch` and the row order they hold (None: in order): `micro_size` rows each,
    or with a token budget `max_tokens` token-balanced ones whose count the ranks agree on first —
    `agree(k)` is the max of k over the ranks, a collective every rank must join once per call. `packing`: the
    trainer forwards packed rows in that layout, so the budget counts `packed_rows.packed_cost`."""
    if max_tokens is None:
        return split_micro_batches(batch, micro_size), None
    lengths = row_lengths(batch)
    own = packed_micro_batch_count(lengths, max_tokens, packing) if packing else micro_batch_count(lengths, max_tokens)
    return split_by_token_budget(batch, agree(own), packing)


FILLER = "filler"
"""`meta` key of a stand-in shard: a rank with no rows of its own gets one real row marked with it, forwards it
with weight 0 (the collectives of FSDP need every rank in every forward) and returns no log-probs for it."""


def shard_bounds(rows: int, world: int) -> list[tuple[int, int]]:
    """`world` contiguous `[lo, hi)` row ranges covering `range(rows)` in order, sizes as equal as possible
    (the first `rows % world` ranges get one row more; with fewer rows than ranks the last ranges are empty)."""
    if world < 1 or rows < 0:
        raise ValueError(f"need world >= 1 and rows >= 0, got world={world}, rows={rows}")
    return contiguous_bounds(rows, world)


def shard_indices(batch: TrainBatch, world: int, balance: bool = False) -> list[list[int]]:
    """The rows of each of `world` DP ranks: contiguous ranges (`shard_bounds`), or with `balance` (token budgets,
    verl's `balance_batch`) equal-sized groups of near-equal token sums (`balanced_partitions(equal_size=True)`
    over `row_lengths`) when `world` divides the rows — contiguous otherwise. Each rank's rows ascend."""
    rows = len(batch)
    if balance and world > 1 and rows and rows % world == 0:
        groups = balanced_partitions(row_lengths(batch), world, equal_size=True)
        return sorted(groups, key=lambda g: g[0])
    return [list(range(lo, hi)) for lo, hi in shard_bounds(rows, world)]


def shard_rows(batch: TrainBatch, world: int, balance: bool = False) -> list[TrainBatch]:
    """Rank r's share of `batch` (`shard_indices`). A rank whose share is empty gets the batch's first row as a
    `FILLER` shard, so every rank has a batch to step through the collectives with."""
    if len(batch) == 0:
        raise ValueError("cannot shard an empty batch")
    shards = []
    for idx in shard_indices(batch, world, balance):
        if not idx:
            filler = batch.select(slice(0, 1))
            filler.meta[FILLER] = True
            shards.append(filler)
        elif idx == list(range(idx[0], idx[-1] + 1)):
            shards.append(batch.select(slice(idx[0], idx[-1] + 1)))
        else:
            shards.append(batch.select(torch.tensor(idx, dtype=torch.long)))
    return shards


def is_filler(batch: TrainBatch) -> bool:
    """True for a `FILLER` stand-in shard (its row is not this rank's to train on)."""
    return bool(batch.meta.get(FILLER))


def trim_padding(batch: TrainBatch) -> tuple[TrainBatch, int]:
    """Drop prompt columns that are padding in every row and response columns past the longest response.

    Returns the trimmed batch and the original response width R, so [b, r] outputs computed on it can be
    right-padded back to [b, R]. Log-probs are unchanged: dropped columns are masked out of attention and
    RoPE positions come from `position_ids`.
    """
    r_full = batch.responses.shape[1]
    p_full = batch.prompt_len
    prompt_real = batch.attention_mask[:, :p_full].any(dim=0).nonzero()
    first = int(prompt_real[0]) if prompt_real.numel() else p_full - 1
    resp_real = batch.response_mask.any(dim=0).nonzero()
    r_keep = int(resp_real[-1]) + 1 if resp_real.numel() else 1
    if first == 0 and r_keep == r_full:
        return batch, r_full
    cols = slice(first, p_full + r_keep)
    trimmed = TrainBatch(
        input_ids=batch.input_ids[:, cols],
        attention_mask=batch.attention_mask[:, cols],
        position_ids=batch.position_ids[:, cols],
        responses=batch.responses[:, :r_keep],
        response_mask=batch.response_mask[:, :r_keep],
        rollout_log_probs=batch.rollout_log_probs[:, :r_keep],
        advantages=None if batch.advantages is None else batch.advantages[:, :r_keep],
        old_log_probs=None if batch.old_log_probs is None else batch.old_log_probs[:, :r_keep],
        ref_log_probs=None if batch.ref_log_probs is None else batch.ref_log_probs[:, :r_keep],
        is_weights=None if batch.is_weights is None else batch.is_weights[:, :r_keep],
        meta=batch.meta,
    )
    return trimmed, r_full


def pad_to(t: torch.Tensor, width: int) -> torch.Tensor:
    """Right-pad the last dimension of a [b, r] output of a trimmed micro-batch back to `width` columns."""
    return torch.nn.functional.pad(t, (0, width - t.shape[1])) if t.shape[1] < width else t


def lockstep_log_probs(forward: Callable[[int], tuple[torch.Tensor, torch.Tensor | None, int]], steps: int,
                       kept: int, response_mask: torch.Tensor, with_entropy: bool, filler: bool,
                       order: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropies) of a rank's micro-batches, in lockstep with its peers.

    `forward(k) -> (log_probs [b, r], entropy or None, R)` runs micro-batch k; every rank makes `steps`
    calls (the most micro-batches any rank has), so collectives inside the forward pair up, and keeps the
    first `kept` results — right-padded to R, concatenated in row order and multiplied by the response mask
    (0 on padding). `order`: the batch rows the concatenated micro-batches hold, when not 0 … B−1 in order
    (token-budget micro-batches); the results are put back in row order. A `filler` shard (no rows of this
    rank's own) returns empty [0, R] tensors."""
    log_probs, entropies = [], []
    with torch.no_grad():
        for k in range(steps):
            lp, ent, width = forward(k)
            if k < kept:
                log_probs.append(pad_to(lp, width).cpu())
                if ent is not None:
                    entropies.append(pad_to(ent, width).cpu())
    mask = response_mask.to(torch.float32)
    if filler:
        return mask[:0], (mask[:0] if with_entropy else None)
    inverse = None if order is None else torch.argsort(torch.tensor(order, dtype=torch.long))

    def rows(parts: list[torch.Tensor]) -> torch.Tensor:
        out = torch.cat(parts)
        return (out if inverse is None else out[inverse]) * mask

    return rows(log_probs), (rows(entropies) if with_entropy else None)
