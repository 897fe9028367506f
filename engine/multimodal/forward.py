"""The extra forward inputs of a Qwen-VL model for a padded batch: pixel values, grids, and 3-D RoPE.

Qwen3-VL rotates queries and keys with multimodal RoPE: every token has a (temporal, height, width) position.
A text token has all three equal; the tokens of an image starting at position s get (s, s + i, s + j) for
its merged patch (i, j); the text after it continues at s + max(h, w)/m. `get_rope_index` (the model's own
method) computes these positions over the real (unmasked) tokens of each row, and

    δ = max position + 1 − (number of real tokens)

per row, so a token appended at text position q (its index among the real tokens) has position q + δ on
all three axes. The `hf` sampler prefills with the positions below and then decodes token q at q + δ; the
trainer computes the positions of the whole [prompt | response] row at once — the same numbers, so the two
agree token for token.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.multimodal.placeholders import check_image_tokens
from engine.multimodal.vision import ImageEncoder, VisionSpec


@dataclass
class VisionInputs:
    """Forward inputs of a batch with images. `position_ids` [3, B, L]; `rope_deltas` [B] (δ above)."""

    pixel_values: torch.Tensor
    image_grid_thw: torch.Tensor
    position_ids: torch.Tensor
    rope_deltas: torch.Tensor

    def model_kwargs(self) -> dict[str, torch.Tensor]:
        return {"pixel_values": self.pixel_values, "image_grid_thw": self.image_grid_thw,
                "position_ids": self.position_ids}


def _rope_owner(model: torch.nn.Module) -> torch.nn.Module:
    """The module with `get_rope_index`: the `*ForConditionalGeneration` itself or its inner `model`."""
    for candidate in (model, getattr(model, "model", None)):
        if candidate is not None and hasattr(candidate, "get_rope_index"):
            return candidate
    raise ValueError(f"{type(model).__name__} has no get_rope_index: not a Qwen-VL model")


def rope_positions(
    model: torch.nn.Module,
    spec: VisionSpec,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    image_grid_thw: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(positions [3, B, L] long, δ [B] long) of a left/right-padded batch (padding gets position 0)."""
    get_rope_index = _rope_owner(model).get_rope_index
    kwargs = {"image_grid_thw": image_grid_thw, "video_grid_thw": None, "attention_mask": attention_mask}
    if "mm_token_type_ids" in inspect.signature(get_rope_index).parameters:  # transformers ≥ 5.2x
        kwargs["mm_token_type_ids"] = (input_ids == spec.image_token_id).to(torch.int32)
    positions, deltas = get_rope_index(input_ids, **kwargs)
    return positions, deltas.reshape(-1).to(torch.long)


def vision_inputs(
    model: torch.nn.Module,
    encoder: ImageEncoder,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    row_images: Sequence[Sequence[str]],
) -> VisionInputs | None:
    """The `VisionInputs` of a batch whose row b carries `row_images[b]`, or None when no row has images.

    Every row's image tokens (among its real tokens) are checked against its images first
    (`PlaceholderMismatch` naming the row), since `get_rope_index` would silently misalign them."""
    if len(row_images) != input_ids.shape[0]:
        raise ValueError(f"{len(row_images)} image lists for a batch of {input_ids.shape[0]} rows")
    flat = [img for imgs in row_images for img in imgs]
    if not flat:
        return None
    ids_cpu, mask_cpu = input_ids.cpu(), attention_mask.cpu().bool()
    for b, imgs in enumerate(row_images):
        counts = [encoder.tokens(img) for img in imgs]
        check_image_tokens(ids_cpu[b][mask_cpu[b]].tolist(), encoder.spec.image_token_id, counts, f"row {b}")
    batch = encoder.batch(flat)
    assert batch is not None
    pixels, grid = batch
    device = input_ids.device
    grid = grid.to(device)
    positions, deltas = rope_positions(model, encoder.spec, input_ids, attention_mask, grid)
    return VisionInputs(pixels.to(device), grid, positions.to(device), deltas.to(device))
