"""The batched decode loop behind the `hf` rollout backend: one KV cache, left-padded rows, rows leave the
batch as soon as they finish.

Layout: row i's context c_i (prompt + resumed prefix, length L_i) is left-padded to L = max L_i, with
attention mask m = [0]*(L − L_i) + [1]*L_i and RoPE positions p = cumsum(m) − 1 (clamped at 0), so a real
token's position does not depend on the padding. Every decode step appends one column (mask 1, position
L_i + t for the t-th new token of row i). Rows with identical contexts (the `n` samples of one prompt)
are prefilled once and their cache rows repeated. After each step the finished rows (EOS sampled or
budget spent) are removed from the cache, the mask and the logits, so compute follows the live rows.

Rows with images (a vision-language model, `MultimodalForward`): contexts are distinct only if their tokens
*and* images are; the prefill gets the pixel values and 3-D M-RoPE positions of `engine.multimodal.forward`,
and the t-th new token of row i is placed at L_i + t + δ_i on all three rotary axes (δ_i = the row's RoPE
offset from the prefill), exactly where the trainer's full-sequence positions put it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from transformers.cache_utils import DynamicCache

from engine.multimodal.forward import vision_inputs
from engine.multimodal.vision import ImageEncoder, placeholder_token_ids, suppress_tokens
from engine.rollout.base import SamplingParams
from engine.rollout.kv_cache import make_cache
from engine.rollout.sampling import select_tokens
from engine.types import FinishReason


@dataclass
class RowSpec:
    """One sequence to extend: `context` (prompt + prefix), the number of new tokens allowed (> 0), and the
    prompt's images (base64, in placeholder order) for a vision-language model."""

    context: list[int]
    budget: int
    images: tuple[str, ...] = ()


@dataclass
class RowOutput:
    tokens: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    finish_reason: FinishReason = "abort"


@dataclass
class DecodeCounters:
    prefill_tokens: int = 0
    decode_steps: int = 0
    row_steps: int = 0


class ForwardAdapter:
    """Calls a transformers causal LM for prefill / decode steps, whatever its cache keyword is
    (`cache` in transformers ≥ 5.x, `past_key_values` before), computing logits of the last position only."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        params = inspect.signature(model.forward).parameters
        self.cache_kw = "cache" if "cache" in params else "past_key_values"
        self.keep_last = "logits_to_keep" in params

    def last_logits(
        self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, cache: DynamicCache, **extra: torch.Tensor
    ) -> torch.Tensor:
        kwargs = {self.cache_kw: cache, "use_cache": True, **extra}
        if self.keep_last:
            kwargs["logits_to_keep"] = 1
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, **kwargs)
        return out.logits[:, -1]

    def prefill(
        self, ids: torch.Tensor, mask: torch.Tensor, cache: DynamicCache, images: Sequence[tuple[str, ...]]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(last logits [N, V], RoPE offsets δ [N]) of left-padded contexts; text models: δ = 0."""
        if any(images):
            raise ValueError("this model takes no images (not a vision-language model)")
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        return self.last_logits(ids, mask, pos, cache), torch.zeros(ids.shape[0], dtype=torch.long, device=ids.device)

    def step(self, tokens: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: DynamicCache) -> torch.Tensor:
        """Last logits after appending `tokens` [N] at rotary `positions` [N] (text position + δ)."""
        return self.last_logits(tokens[:, None], mask, positions[:, None], cache)


class MultimodalForward(ForwardAdapter):
    """`ForwardAdapter` for a Qwen-VL model: image inputs at prefill, 3-D rotary positions throughout, and
    the image/video placeholder tokens never sampled (their logits are −∞: they are input-only, and one in a
    response would claim image features that do not exist). The trainer masks the same tokens
    (`engine.trainer.logprobs`), so both report log-probs of the same distribution."""

    def __init__(self, model: torch.nn.Module, encoder: ImageEncoder | None) -> None:
        super().__init__(model)
        self.encoder = encoder
        self.suppressed = placeholder_token_ids(model.config)

    def last_logits(
        self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, cache: DynamicCache, **extra: torch.Tensor
    ) -> torch.Tensor:
        logits = super().last_logits(ids, mask, pos, cache, **extra)
        return suppress_tokens(logits, self.suppressed)

    def prefill(
        self, ids: torch.Tensor, mask: torch.Tensor, cache: DynamicCache, images: Sequence[tuple[str, ...]]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not any(images):
            return super().prefill(ids, mask, cache, images)
        if self.encoder is None:
            raise ValueError("rows with images need an image encoder")
        vis = vision_inputs(self.model, self.encoder, ids, mask, images)
        assert vis is not None
        kwargs = vis.model_kwargs()
        pos = kwargs.pop("position_ids")
        return self.last_logits(ids, mask, pos, cache, **kwargs), vis.rope_deltas

    def step(self, tokens: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: DynamicCache) -> torch.Tensor:
        pos = positions[None, :, None].expand(3, -1, 1)
        return self.last_logits(tokens[:, None], mask, pos, cache)


def left_pad(contexts: Sequence[Sequence[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """`(input_ids, attention_mask)` [N, max len] with every context right-aligned."""
    width = max(len(c) for c in contexts)
    ids = torch.full((len(contexts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(contexts), width), dtype=torch.long)
    for i, ctx in enumerate(contexts):
        if ctx:
            ids[i, width - len(ctx):] = torch.tensor(ctx, dtype=torch.long)
            mask[i, width - len(ctx):] = 1
    return ids.to(device), mask.to(device)


def decode_rows(
    forward: ForwardAdapter,
    rows: Sequence[RowSpec],
    params: SamplingParams,
    *,
    eos_ids: torch.Tensor,
    pad_id: int,
    generator: torch.Generator | None,
    should_abort: Callable[[], bool],
    device: torch.device,
    counters: DecodeCounters,
) -> list[RowOutput]:
    """Extend every row until EOS (reason "stop"), its budget ("length"), or `should_abort()` turns True at
    a token boundary ("abort", tokens so far kept). Must run under `torch.inference_mode()`."""
    outputs = [RowOutput() for _ in rows]
    if not rows or should_abort():
        return outputs
    unique: dict[tuple[tuple[int, ...], tuple[str, ...]], int] = {}
    source = [unique.setdefault((tuple(r.context), tuple(r.images)), len(unique)) for r in rows]
    contexts = [c for c, _ in unique]
    ids, mask = left_pad(contexts, pad_id, device)
    cache = make_cache(getattr(forward.model, "config", None), ids.shape[1] + max(r.budget for r in rows))
    logits, offsets = forward.prefill(ids, mask, cache, [imgs for _, imgs in unique])
    counters.prefill_tokens += int(mask.sum())
    expand = torch.tensor(source, dtype=torch.long, device=device)
    if len(contexts) < len(rows):
        cache.select_rows(expand)
    logits, mask, offsets = logits[expand], mask[expand], offsets[expand]
    next_pos = torch.tensor([len(r.context) for r in rows], dtype=torch.long, device=device)
    budgets = torch.tensor([r.budget for r in rows], dtype=torch.long, device=device)
    active = torch.arange(len(rows), device=device)
    max_steps = int(budgets.max())
    new_tokens = torch.empty((len(rows), max_steps), dtype=torch.long, device=device)
    new_log_probs = torch.empty((len(rows), max_steps), dtype=torch.float32, device=device)
    lengths = torch.zeros(len(rows), dtype=torch.long, device=device)
    stopped = torch.zeros(len(rows), dtype=torch.bool, device=device)
    for step in range(max_steps):
        if should_abort():
            break
        tokens, log_probs = select_tokens(logits, params, generator)
        new_tokens[active, step] = tokens
        new_log_probs[active, step] = log_probs
        lengths[active] = step + 1
        hit_eos = torch.isin(tokens, eos_ids)
        stopped[active] = hit_eos
        done = hit_eos | (budgets[active] <= step + 1)
        counters.row_steps += int(active.numel())
        if bool(done.all()):
            active = active[:0]
            break
        if bool(done.any()):
            keep = (~done).nonzero().squeeze(-1)
            cache.select_rows(keep)
            active, tokens, mask, next_pos = active[keep], tokens[keep], mask[keep], next_pos[keep]
            offsets = offsets[keep]
        mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=1)
        logits = forward.step(tokens, mask, next_pos + offsets, cache)
        next_pos = next_pos + 1
        counters.decode_steps += 1
    lengths_list = lengths.tolist()
    stopped_list = stopped.tolist()
    still_running = set(active.tolist())
    token_rows = new_tokens.tolist()
    log_prob_rows = new_log_probs.tolist()
    for i, out in enumerate(outputs):
        n = lengths_list[i]
        out.tokens = token_rows[i][:n]
        out.log_probs = log_prob_rows[i][:n]
        if i in still_running:
            out.finish_reason = "abort"
        else:
            out.finish_reason = "stop" if stopped_list[i] else "length"
    return outputs
