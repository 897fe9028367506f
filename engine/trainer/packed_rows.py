"""Packed rows (verl's `use_remove_padding`): a micro-batch's rows forwarded without their padding.

A padded row i holds ℓ_i = p_i + r_i real tokens (its prompt without the left padding, its response without the
right padding) at positions 0 … ℓ_i − 1 (`engine.trainer.batch`: position_ids = cumsum(attention_mask) − 1). The
packed forward concatenates the rows' real tokens:

    tokens     = row_1, row_2, …                          (Σℓ_i tokens instead of B · max ℓ)
    positions  = 0 … ℓ_1 − 1, 0 … ℓ_2 − 1, …              (restarting per row: each row's own positions)
    may attend = token t of row i to the tokens u ≤ t of row i only

so every real token sees exactly the keys, values and rotary positions it had in its padded row (padding only
ever contributed masked-out scores), and its hidden state, log-prob and gradient are the padded forward's (up to
floating-point summation order). log π(y_ij) is read at the flat index start_i + p_i − 1 + j (the hidden state
that predicts response token j), so the result is per row, [B, R], exactly as
`engine.trainer.logprobs.response_log_probs` returns it. The forward itself is `shared_prefix`'s
(`shared_prompt_log_probs`): a packed micro-batch is a `SharedBatch` whose "groups" are single rows.

Two layouts, by the model's attention implementation (`layout`):

- **varlen** (a flash-attention implementation, `flash_attention_2` / `_3` or a kernels-hub flash kernel,
  on CUDA): one sequence [1, Σℓ_i] and no mask — transformers reads the restarting position ids as packed
  sequences, cu_seqlens = (0, ℓ_1, ℓ_1 + ℓ_2, …), and calls `flash_attn_varlen_func`: Σℓ_i² attention work,
  Σℓ_i tokens through every layer, nothing of size (Σℓ)².
- **masked** (`eager` / `sdpa`, e.g. on CPU — the shared-prompt forward's masked path): the rows, longest first,
  first-fit into S sequences of width L = max ℓ_i (the padded width), each with a block-diagonal causal additive
  mask [S, 1, L, L] (`shared_prefix.additive_mask`; a slot left empty at a sequence's end attends to itself only).
  Since S ≤ B: S·L tokens and S·L² attention scores, never more than the padded B·L and B·L² — the linear layers
  see Σℓ_i plus the sequences' unfilled slack.

Which forward a micro-batch takes (`packed_forward_batch`): with `shared_prompt` the shared-prompt packing
where it applies and pays (`shared_prefix.worth_sharing`), with packing the packed rows where the layout
applies (masked: where first fit removes padding, S·L < B·L); of those, the one that forwards fewer tokens;
neither → the padded rows.

Token budgets (`use_dynamic_bsz`) with packing count the tokens the packed forward computes on instead of the
padded rows' B · max ℓ (`engine.trainer.minibatch`): Σℓ_i — the real tokens, verl's count — on the varlen layout,
S·L on the masked one (the real tokens plus the first-fit slack, so a budget still bounds the activations).
`packed_cost` is that count; `packed_micro_batch_count` / `packed_micro_batches` cut rows by it exactly as
`micro_batch_count` / `token_budget_micro_batches` cut them by the padded cost.
"""

from __future__ import annotations

import importlib.util
import inspect
from collections.abc import Callable
from typing import Literal

import torch

from engine.trainer.shared_prefix import SharedBatch, additive_mask, pack, row_parts, worth_sharing

Layout = Literal["varlen", "masked"]


def layout(model: torch.nn.Module) -> Layout | None:
    """The packed layout `model` supports (module docstring), or None: a text model whose forward takes
    `logits_to_keep` and whose attention is a flash kernel (varlen) or eager / sdpa (masked)."""
    impl = str(getattr(getattr(model, "config", None), "_attn_implementation", None) or "")
    if model.get_output_embeddings() is None or "logits_to_keep" not in inspect.signature(model.forward).parameters:
        return None
    if "flash" in impl:
        return "varlen"
    return "masked" if impl in ("eager", "sdpa") else None


def packing_layout(model: torch.nn.Module, enabled: bool, device: torch.device, compute_dtype: torch.dtype
                   ) -> Layout | None:
    """The trainer's packed layout (None: packing off or not applicable). On CUDA, computing in bf16 / fp16 with
    sdpa attention and the `flash_attn` package installed, the model is first switched to `flash_attention_2`
    (the same attention, whose varlen kernel then takes the packed rows; flash-attention has no fp32 kernel);
    if transformers refuses the switch, the masked layout applies."""
    if not enabled:
        return None
    impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if (device.type == "cuda" and compute_dtype in (torch.bfloat16, torch.float16) and impl == "sdpa"
            and importlib.util.find_spec("flash_attn") is not None and hasattr(model, "set_attn_implementation")):
        try:
            model.set_attn_implementation("flash_attention_2")
        except (ImportError, ValueError):
            pass
    return layout(model)


def first_fit(lengths: list[int], width: int) -> list[list[int]]:
    """The indices of `lengths` first-fit, longest first, into sequences of `width` tokens (each sequence
    lists its rows in placing order)."""
    bins: list[list[int]] = []
    fill: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda k: (-lengths[k], k)):
        for b, used in enumerate(fill):
            if used + lengths[i] <= width:
                bins[b].append(i)
                fill[b] += lengths[i]
                break
        else:
            bins.append([i])
            fill.append(lengths[i])
    return bins


def pack_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor, response_len: int, kind: Layout,
              pad_id: int = 0, mask_dtype: torch.dtype = torch.float32) -> SharedBatch:
    """The packed rows of a padded batch (`engine.trainer.batch` layout: left-padded prompts, right-padded
    responses of width `response_len`) in layout `kind`: one sequence and no mask (varlen), or first-fit
    sequences of the longest row's width with their block-diagonal causal masks (masked)."""
    prompts, r_lens = row_parts(input_ids, attention_mask, response_len)
    lengths = [len(p) + r for p, r in zip(prompts, r_lens)]
    p_width = input_ids.shape[1] - response_len
    bins = [list(range(len(lengths)))] if kind == "varlen" else first_fit(lengths, max(lengths))
    width = sum(lengths) if kind == "varlen" else max(lengths)
    ids = torch.full((len(bins), width), pad_id, dtype=torch.long)
    pos = torch.zeros((len(bins), width), dtype=torch.long)
    predictors = torch.zeros((input_ids.shape[0], max(response_len, 1)), dtype=torch.long)
    allowed = torch.zeros((len(bins), width, width), dtype=torch.bool) if kind == "masked" else None
    causal = torch.ones((width, width), dtype=torch.bool).tril()
    for s, rows in enumerate(bins):
        at = 0
        for i in rows:
            n_p, n_r, n = len(prompts[i]), r_lens[i], lengths[i]
            ids[s, at:at + n_p] = torch.tensor(prompts[i], dtype=torch.long)
            ids[s, at + n_p:at + n] = input_ids[i, p_width:p_width + n_r]
            pos[s, at:at + n] = torch.arange(n)
            predictors[i, :n_r] = s * width + at + n_p - 1 + torch.arange(n_r)
            if allowed is not None:
                allowed[s, at:at + n, at:at + n] = causal[:n, :n]
            at += n
        if allowed is not None:
            allowed[s, at:, at:] = torch.eye(width - at, dtype=torch.bool)
    mask = None if allowed is None else additive_mask(allowed, mask_dtype)
    return SharedBatch(ids, pos, mask, predictors)


def packed_forward_batch(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                         response_len: int, shared_prompt: bool, packing: Layout | None,
                         mask_dtype: torch.dtype = torch.float32) -> SharedBatch | None:
    """What a text micro-batch is forwarded as (module docstring): the shared-prompt packing or the rows packed in
    layout `packing` (`packing_layout`), whichever forwards fewer tokens, or None for the padded rows."""
    ids, mask = input_ids.cpu(), attention_mask.cpu()
    options = []
    if shared_prompt and worth_sharing(model, ids, mask, response_len, mask_dtype):
        options.append(pack(ids, mask, response_len, mask_dtype=mask_dtype))
    if packing is not None and response_len >= 1:
        rows = pack_rows(ids, mask, response_len, packing, mask_dtype=mask_dtype)
        if packing == "varlen" or rows.tokens < ids.numel():  # masked: only where padding is removed
            options.append(rows)
    return min(options, key=lambda b: b.tokens) if options else None


# --- token budgets of packed micro-batches (`engine.trainer.minibatch`, `trainer.use_dynamic_bsz`) ----------------
def packed_cost(lengths: list[int], kind: Layout) -> int:
    """Tokens a packed micro-batch of rows with `lengths` forwards: Σℓ (varlen), S·max ℓ (masked: `first_fit`)."""
    if not lengths:
        return 0
    if kind == "varlen":
        return sum(lengths)
    return len(first_fit(lengths, max(lengths))) * max(lengths)


def _runs(order: list[int], lengths: list[int], budget: int, kind: Layout) -> list[list[int]]:
    """`order` (rows by descending length) cut greedily into consecutive runs of packed cost ≤ `budget` (a row
    longer than the budget alone). The first row of a run is its longest, so the masked cost grows by first fit
    into bins of that width, one row at a time."""
    runs: list[list[int]] = []
    fill: list[int] = []
    for i in order:
        n = lengths[i]
        if runs:
            width = lengths[runs[-1][0]]
            if kind == "varlen":
                fits = sum(fill) + n <= budget
                slot = 0
            else:
                slot = next((b for b, used in enumerate(fill) if used + n <= width), len(fill))
                fits = (max(slot + 1, len(fill))) * width <= budget
            if fits:
                runs[-1].append(i)
                if kind == "varlen" or slot < len(fill):
                    fill[slot] += n
                else:
                    fill.append(n)
                continue
        runs.append([i])
        fill = [n]
    return runs


def packed_micro_batch_count(lengths: list[int], max_tokens: int, kind: Layout) -> int:
    """The fewest micro-batches of packed cost ≤ `max_tokens` (consecutive runs of the rows by descending length;
    at most one per row; 1 for no rows) — `micro_batch_count` with `packed_cost`."""
    if max_tokens < 1:
        raise ValueError(f"the token budget must be >= 1, got {max_tokens}")
    if not lengths:
        return 1
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    return len(_runs(order, lengths, max_tokens, kind))


def packed_micro_batches(lengths: list[int], count: int, kind: Layout) -> list[list[int]]:
    """The row indices of min(`count`, rows) micro-batches with the least largest packed cost (bisection on the
    bound of the greedy cut, then the costliest runs halved until there are `count`), heaviest (Σℓ², the
    attention work) first, indices ascending within each — `token_budget_micro_batches` with `packed_cost`."""
    n = len(lengths)
    if n == 0:
        return []
    count = max(1, min(count, n))
    order = sorted(range(n), key=lambda i: (-lengths[i], i))
    cost: Callable[[list[int]], int] = lambda run: packed_cost([lengths[i] for i in run], kind)  # noqa: E731
    lo, hi = lengths[order[0]], max(cost(order), lengths[order[0]])
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if len(_runs(order, lengths, mid, kind)) <= count else (mid + 1, hi)
    runs = _runs(order, lengths, lo, kind)
    while len(runs) < count:
        k = max((r for r in range(len(runs)) if len(runs[r]) > 1), key=lambda r: cost(runs[r]))
        run = runs.pop(k)
        runs[k:k] = [run[: len(run) // 2], run[len(run) // 2:]]
    groups = [sorted(r) for r in runs]
    return sorted(groups, key=lambda g: (-sum(lengths[i] ** 2 for i in g), g[0]))
