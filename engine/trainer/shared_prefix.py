"""Shared-prompt forward: the rows of a GRPO group share their prompt, so it goes through the model once.

A group of n rows with prompt p (|p| tokens) and responses r_1 … r_n becomes one sequence

    tokens     = p, r_1, r_2, …, r_n                      (|p| + Σ|r_i| tokens instead of n·|p| + Σ|r_i|)
    positions  = 0 … |p|−1, then |p| … |p|+|r_i|−1 for each r_i     (each response continues its prompt)
    may attend = causal within p; r_i's tokens to all of p and causally to r_i — never to another r_j

so every response token sees exactly the context it had in its own padded row, and its hidden state, logits and
log-prob are those of the unshared forward (equal up to floating-point summation order). The gradient is the
same function too: the prompt's activations receive the sum of the n responses' contributions, which the
unshared forward computes n times and adds. The projections and MLPs — most of the FLOPs at these lengths —
run on |p| + Σ|r_i| tokens; for the demo's groups (n = 8, |p| ≈ 100, |r| ≤ 40) that is ~2.7× fewer.

log π(y_ij) is read from the hidden state that predicts it: the prompt's last position for the first token of
every response, then the previous token of the same response. Rows are grouped by identical prompt tokens
within the micro-batch handed in (a group split across micro-batches shares within each part), so the result
is per row, in the batch's order, exactly as `engine.trainer.logprobs.response_log_probs` returns it.

Where it applies (`worth_sharing`): a text model whose forward takes `logits_to_keep` and a dense 4-D additive
mask — transformers' `eager` and `sdpa` attention (flash-attention kernels take no arbitrary mask) — when the
packing forwards at least `MIN_SAVING`× fewer padded tokens and its mask [G, L, L] stays under `MAX_MASK_BYTES`
(`engine.plan.prompt_sharing`, the rule `asyncrl plan` predicts with)
(long rows on an accelerator would want a varlen or flex-attention kernel instead; not built).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import inspect

import torch

from engine.trainer.logprobs import chunked_token_log_probs, token_log_probs
from engine.plan.prompt_sharing import pays


@dataclass
class SharedBatch:
    """A micro-batch packed one sequence per prompt (module docstring): `input_ids`, `position_ids` [G, L],
    `mask` [G, 1, L, L] (additive: 0 where attending is allowed, the dtype's minimum elsewhere; None for
    `engine.trainer.packed_rows`' varlen layout, whose restarting positions delimit its rows), and for each
    row of the original batch, `predictors` [B, R]: the flat index (g·L + position) of the hidden state that
    predicts its response token j (0 past the response's end)."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    mask: torch.Tensor | None
    predictors: torch.Tensor

    @property
    def tokens(self) -> int:
        return int(self.input_ids.numel())


def row_parts(input_ids: torch.Tensor, attention_mask: torch.Tensor, response_len: int
              ) -> tuple[list[tuple[int, ...]], list[int]]:
    """Each row's prompt tokens (without the left padding) and its response length (real tokens)."""
    p_width = input_ids.shape[1] - response_len
    ids, mask = input_ids.tolist(), attention_mask.tolist()
    prompts = [tuple(t for t, m in zip(row[:p_width], mrow[:p_width]) if m) for row, mrow in zip(ids, mask)]
    lengths = [int(sum(mrow[p_width:])) for mrow in mask]
    return prompts, lengths


def worth_sharing(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_len: int,
                  mask_dtype: torch.dtype = torch.float32) -> bool:
    """Whether the shared-prompt forward applies to `model` and pays for this batch (module docstring)."""
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) not in ("eager", "sdpa"):
        return False
    if model.get_output_embeddings() is None or "logits_to_keep" not in inspect.signature(model.forward).parameters:
        return False
    if input_ids.shape[0] < 2 or response_len < 1:
        return False
    prompts, lengths = row_parts(input_ids, attention_mask, response_len)
    groups: dict[tuple[int, ...], int] = {}
    for p, n in zip(prompts, lengths):
        groups[p] = groups.get(p, 0) + n
    width = max(len(p) + n for p, n in groups.items())
    return pays(input_ids.numel(), len(groups), width, torch.finfo(mask_dtype).bits // 8)


def pack(input_ids: torch.Tensor, attention_mask: torch.Tensor, response_len: int, pad_id: int = 0,
         mask_dtype: torch.dtype = torch.float32) -> SharedBatch:
    """The shared-prompt packing of a padded batch (`engine.trainer.batch` layout: left-padded prompts, right-
    padded responses of width `response_len`)."""
    prompts, lengths = row_parts(input_ids, attention_mask, response_len)
    p_width = input_ids.shape[1] - response_len
    order: dict[tuple[int, ...], list[int]] = {}
    for i, p in enumerate(prompts):
        order.setdefault(p, []).append(i)
    groups = list(order.items())
    width = max(len(p) + sum(lengths[i] for i in rows) for p, rows in groups)
    g_count, b = len(groups), input_ids.shape[0]
    ids = torch.full((g_count, width), pad_id, dtype=torch.long)
    pos = torch.zeros((g_count, width), dtype=torch.long)
    predictors = torch.zeros((b, max(response_len, 1)), dtype=torch.long)
    allowed = []
    for g, (prompt, rows) in enumerate(groups):
        n_p = len(prompt)
        ids[g, :n_p] = torch.tensor(prompt, dtype=torch.long)
        pos[g, :n_p] = torch.arange(n_p)
        at = n_p
        for i in rows:
            n = lengths[i]
            if n:
                ids[g, at:at + n] = input_ids[i, p_width:p_width + n]
                pos[g, at:at + n] = torch.arange(n_p, n_p + n)
                predictors[i, 0] = g * width + n_p - 1
                predictors[i, 1:n] = g * width + torch.arange(at, at + n - 1)
            at += n
        allowed.append(group_allowed(n_p, [lengths[i] for i in rows], width))
    return SharedBatch(ids, pos, additive_mask(torch.stack(allowed), mask_dtype), predictors)


def group_allowed(prompt_len: int, response_lens: Sequence[int], width: int) -> torch.Tensor:
    """Which positions of one packed sequence (prompt, then the responses, then padding to `width`) may attend to
    which [width, width] (bool): causal within the prompt; a response's tokens to the whole prompt and causally
    to their own response; each padding position to itself only (its row stays finite)."""
    causal = torch.ones((width, width), dtype=torch.bool).tril()
    allowed = torch.zeros((width, width), dtype=torch.bool)
    allowed[:prompt_len, :prompt_len] = causal[:prompt_len, :prompt_len]
    at = prompt_len
    for n in response_lens:
        allowed[at:at + n, :prompt_len] = True
        allowed[at:at + n, at:at + n] = causal[:n, :n]
        at += n
    allowed[at:, at:] = torch.eye(width - at, dtype=torch.bool)
    return allowed


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The 4-D additive mask [G, 1, L, L] of `allowed` [G, L, L]: 0 where allowed, the dtype's minimum elsewhere
    (what transformers' eager and sdpa attention add to the scores)."""
    mask = torch.zeros((allowed.shape[0], 1, *allowed.shape[1:]), dtype=dtype)
    return mask.masked_fill_(~allowed.unsqueeze(1), torch.finfo(dtype).min)


def shared_prompt_log_probs(
    model: torch.nn.Module,
    packed: SharedBatch,
    responses: torch.Tensor,
    temperature: float,
    with_entropy: bool = False,
    entropy_grad: bool = True,
    suppress_ids: Sequence[int] = (),
    chunk_tokens: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log π_θ(response token) [B, R] (and entropy) through one shared-prompt forward of `packed`; the same
    values as `response_log_probs` on the padded rows. The output head runs inside the model's own forward
    (its `forward` replaced for the call, as `response_log_probs` does with `chunk_tokens`), on the B × R
    predicting positions only; a padding position reads some finite log-prob, as the padded forward's does (the
    response mask drops it)."""
    head = model.get_output_embeddings()
    plain_forward = head.forward
    b, r = responses.shape
    device = responses.device

    def shared_head(hidden: torch.Tensor) -> torch.Tensor:
        picked_h = hidden.reshape(-1, hidden.shape[-1])[packed.predictors.to(device)[:, :r].reshape(-1)]
        picked_h = picked_h.reshape(b, r, -1)
        if chunk_tokens:
            picked, ent = chunked_token_log_probs(picked_h, plain_forward, responses, temperature, with_entropy,
                                                  entropy_grad, suppress_ids, chunk_tokens)
        else:
            picked, ent = token_log_probs(plain_forward(picked_h), responses, temperature, with_entropy,
                                          entropy_grad, suppress_ids)
        return torch.stack([picked, ent if ent is not None else torch.zeros_like(picked.detach())], dim=-1)

    head.forward = shared_head
    try:
        mask = None if packed.mask is None else packed.mask.to(device)
        out = model(input_ids=packed.input_ids.to(device), attention_mask=mask,
                    position_ids=packed.position_ids.to(device), use_cache=False, logits_to_keep=0)
    finally:
        del head.forward
    result = out.logits
    entropy = result[..., 1] if with_entropy else None
    if entropy is not None and not entropy_grad:
        entropy = entropy.detach()
    return result[..., 0], entropy
