"""The row layout and model calls behind the `hf` rollout backend's decode loop
(`engine.rollout.hf.continuous`): one KV cache, left-padded rows.

Layout: row i's context c_i (prompt + resumed prefix, length L_i) is left-padded to L = max L_i, with
attention mask m = [0]*(L − L_i) + [1]*L_i and RoPE positions p = cumsum(m) − 1 (clamped at 0), so a real
token's position does not depend on the padding. Every decode step appends one column (mask 1, position
L_i + t for the t-th new token of row i). Rows with identical contexts (the `n` samples of one prompt)
are prefilled once and their cache rows repeated.

Rows with images (a vision-language model, `MultimodalForward`): contexts are distinct only if their tokens
*and* images are; the prefill gets the pixel values and 3-D M-RoPE positions of `engine.multimodal.forward`,
and the t-th new token of row i is placed at L_i + t + δ_i on all three rotary axes (δ_i = the row's RoPE
offset from the prefill), exactly where the trainer's full-sequence positions put it.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from transformers.cache_utils import DynamicCache

from engine.multimodal.forward import vision_inputs
from engine.multimodal.vision import ImageEncoder, placeholder_token_ids, suppress_tokens
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
