"""Per-token log-probs (and entropy) of the response tokens under a causal LM, vocab work on responses only.

For a row with prompt width P and response width R, the logits that predict response token j sit at
sequence position P − 1 + j, so only positions P − 1 … P + R − 2 go through `lm_head`:

    log π(y_j) = log_softmax(z_{P−1+j} / T)[y_j],      H_j = −Σ_v π_v log π_v   (same tempered π)

computed in fp32. With `chunk_tokens` the head runs chunk by chunk (`chunked_token_log_probs`: at most
[chunk × V] fp32 logits at once, recomputed in backward), and the entropy H is computed only when asked
(a loss with an entropy bonus, or the `actor/entropy` metric). The model is called through its own `forward` with `logits_to_keep = R + 1` (the last
R + 1 positions, of which the final one is dropped), so FSDP's root hooks run and no [B, P + R, V] logits
are ever materialised. Models whose forward lacks `logits_to_keep` fall back to the decoder +
output embeddings (`get_decoder()` / `get_output_embeddings()`).

Vision-language models get their image inputs and 3-D rotary positions through `model_kwargs`
(`engine.multimodal.forward.VisionInputs`), and their input-only placeholder tokens S through `suppress_ids`:
π(v) ∝ exp(z_v / T) · 1[v ∉ S], the distribution the `hf` sampler draws from (terms with π_v = 0 add 0 to H).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.utils.checkpoint

from engine.multimodal.vision import suppress_tokens


def _keeps_logits(model: torch.nn.Module) -> bool:
    return "logits_to_keep" in inspect.signature(model.forward).parameters


def response_logits(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    response_len: int,
    model_kwargs: Mapping[str, Any] | None = None,
) -> torch.Tensor:
    """Logits [B, R, V] (model dtype) predicting each of the last `response_len` tokens of `input_ids`;
    `model_kwargs` are extra forward inputs (a `position_ids` there replaces the argument)."""
    if _keeps_logits(model):
        kwargs: dict[str, Any] = {"position_ids": position_ids, **(model_kwargs or {})}
        out = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            use_cache=False,
            logits_to_keep=response_len + 1,
            **kwargs,
        )
        return out.logits[:, :-1]
    if model_kwargs:
        raise ValueError(f"{type(model).__name__}.forward has no logits_to_keep: extra inputs are not supported")
    hidden = model.get_decoder()(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
    ).last_hidden_state
    return model.get_output_embeddings()(hidden[:, -response_len - 1 : -1])


def token_log_probs(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    temperature: float,
    with_entropy: bool = False,
    entropy_grad: bool = True,
    suppress_ids: Sequence[int] = (),
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`log_softmax(logits / T)` gathered at `tokens` (fp32, [B, R]); entropy of the same distribution
    (outside autograd when `entropy_grad` is False: a metric only). `suppress_ids` get probability 0."""
    scaled = logits.float() / temperature
    if suppress_ids:
        scaled = suppress_tokens(scaled, suppress_ids)
    log_p = torch.log_softmax(scaled, dim=-1)
    picked = log_p.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    entropy = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            finite = log_p.masked_fill(torch.isinf(log_p), 0.0) if suppress_ids else log_p
            entropy = -(log_p.exp() * finite).sum(-1)
    return picked, entropy


def chunked_token_log_probs(
    hidden: torch.Tensor,
    head: torch.nn.Module,
    tokens: torch.Tensor,
    temperature: float,
    with_entropy: bool = False,
    entropy_grad: bool = True,
    suppress_ids: Sequence[int] = (),
    chunk_tokens: int = 4096,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`token_log_probs(head(hidden), …)` for hidden states [B, R, H], `chunk_tokens` tokens at a time: each
    chunk's logits [c, V] are computed, reduced to (log π, H) and dropped; in backward each chunk is
    recomputed (activation checkpointing), so at most one chunk's fp32 logits exist at any time."""
    b, r, h = hidden.shape
    flat_h, flat_t = hidden.reshape(b * r, h), tokens.reshape(b * r)

    def one(h_c: torch.Tensor, t_c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        picked, ent = token_log_probs(head(h_c), t_c, temperature, with_entropy, entropy_grad, suppress_ids)
        return picked, ent if ent is not None else picked.new_zeros(())

    picks, ents = [], []
    for start in range(0, b * r, max(1, int(chunk_tokens))):
        h_c, t_c = flat_h[start : start + chunk_tokens], flat_t[start : start + chunk_tokens]
        if torch.is_grad_enabled() and h_c.requires_grad:
            picked, ent = torch.utils.checkpoint.checkpoint(one, h_c, t_c, use_reentrant=False)
        else:
            picked, ent = one(h_c, t_c)
        picks.append(picked)
        ents.append(ent)
    entropy = torch.cat(ents).reshape(b, r) if with_entropy else None
    return torch.cat(picks).reshape(b, r), entropy


def response_log_probs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    responses: torch.Tensor,
    temperature: float,
    with_entropy: bool = False,
    entropy_grad: bool = True,
    model_kwargs: Mapping[str, Any] | None = None,
    suppress_ids: Sequence[int] = (),
    chunk_tokens: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log π_θ(response token) [B, R] at `temperature` (and entropy [B, R] if asked); differentiable.
    `chunk_tokens`: the output projection runs inside the model's forward but chunked
    (`chunked_token_log_probs`), so no [B, R, V] logits exist; None = the plain head."""
    r = responses.shape[1]
    head = model.get_output_embeddings() if chunk_tokens else None
    if head is None:
        logits = response_logits(model, input_ids, attention_mask, position_ids, r, model_kwargs)
        return token_log_probs(logits, responses, temperature, with_entropy, entropy_grad, suppress_ids)
    plain_forward = head.forward

    def chunked_head(hidden: torch.Tensor) -> torch.Tensor:
        # called on the R + 1 kept positions (R in the decoder fallback), of which the first R predict the
        # response: hand back [B, R + 1, 2] = (log π, H) as "logits", the extra row 0 (`response_logits` drops
        # it), so the result leaves through the model's output, where FSDP2's backward hooks sit
        picked, ent = chunked_token_log_probs(hidden[:, :r], plain_forward, responses, temperature, with_entropy,
                                              entropy_grad, suppress_ids, chunk_tokens)
        packed = torch.stack([picked, ent if ent is not None else torch.zeros_like(picked.detach())], dim=-1)
        return torch.nn.functional.pad(packed, (0, 0, 0, hidden.shape[1] - r))

    head.forward = chunked_head  # the module's own __call__ (hooks included) now runs the chunked head
    try:
        packed = response_logits(model, input_ids, attention_mask, position_ids, r, model_kwargs)
    finally:
        del head.forward
    entropy = packed[..., 1] if with_entropy else None
    if entropy is not None and not entropy_grad:
        entropy = entropy.detach()  # a metric: it shares `packed` with the log-probs, not their graph
    return packed[..., 0], entropy
