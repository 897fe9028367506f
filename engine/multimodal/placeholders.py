"""Image placeholders: from a dataset prompt's `<image>` markers to vision tokens, and their checks.

verl's multimodal datasets (geo3k) mark each image in the prompt text with `<image>`; the i-th marker stands
for the i-th image of the row. Rendering turns each marker into the model's vision block — with a chat
template, a message content list `[{"type": "image"}, {"type": "text", "text": ...}]` the template renders
as `<|vision_start|><|image_pad|><|vision_end|>`; without one, that text itself. After tokenising, the i-th
`<|image_pad|>` is expanded to the i-th image's vision-token count (`expand_image_tokens`), which is what the
model consumes. `image_runs` / `check_image_tokens` verify any token sequence against its images: one run
of image tokens per image, in order, each exactly that image's count.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

IMAGE_PLACEHOLDER = "<image>"


class PlaceholderMismatch(ValueError):
    """A prompt whose image placeholders do not match its images."""


def count_placeholders(prompt: list[dict[str, str]] | str) -> int:
    """Number of `<image>` markers in a prompt (all messages)."""
    if isinstance(prompt, str):
        return prompt.count(IMAGE_PLACEHOLDER)
    return sum(str(m.get("content", "")).count(IMAGE_PLACEHOLDER) for m in prompt)


def to_content_list(text: str) -> list[dict[str, str]]:
    """`"<image>Find x."` → `[{"type": "image"}, {"type": "text", "text": "Find x."}]` (empty texts dropped)."""
    parts: list[dict[str, str]] = []
    for i, chunk in enumerate(text.split(IMAGE_PLACEHOLDER)):
        if i > 0:
            parts.append({"type": "image"})
        if chunk:
            parts.append({"type": "text", "text": chunk})
    return parts


def multimodal_messages(messages: list[dict[str, str]]) -> list[dict[str, Any]]:
    """Chat messages with every `<image>` turned into an image item of a content list (messages without a
    marker keep their plain string content)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        content = str(m["content"])
        out.append({**m, "content": to_content_list(content) if IMAGE_PLACEHOLDER in content else content})
    return out


def replace_placeholders(text: str, vision_block: str) -> str:
    """`text` with each `<image>` replaced by the model's vision block (for tokenizers without a template)."""
    return text.replace(IMAGE_PLACEHOLDER, vision_block)


def image_runs(ids: Sequence[int], image_token_id: int) -> list[int]:
    """Lengths of the maximal runs of `image_token_id` in `ids`, in order."""
    runs: list[int] = []
    prev = False
    for tok in ids:
        hit = tok == image_token_id
        if hit and prev:
            runs[-1] += 1
        elif hit:
            runs.append(1)
        prev = hit
    return runs


def expand_image_tokens(ids: Sequence[int], image_token_id: int, counts: Sequence[int]) -> list[int]:
    """Replace the i-th single `image_token_id` of `ids` by `counts[i]` copies. `PlaceholderMismatch` when
    `ids` does not hold exactly one image token per image."""
    runs = image_runs(ids, image_token_id)
    if len(runs) != len(counts) or any(r != 1 for r in runs):
        raise PlaceholderMismatch(
            f"the rendered prompt has {sum(runs)} image token(s) in {len(runs)} place(s) for {len(counts)} "
            "image(s)")
    out: list[int] = []
    k = 0
    for tok in ids:
        if tok == image_token_id:
            out.extend([image_token_id] * int(counts[k]))
            k += 1
        else:
            out.append(tok)
    return out


def check_image_tokens(ids: Sequence[int], image_token_id: int, counts: Sequence[int], what: str) -> None:
    """Raise `PlaceholderMismatch` (naming `what`) unless `ids` holds one run of image tokens per image with
    exactly that image's vision-token count."""
    runs = image_runs(ids, image_token_id)
    if runs != [int(c) for c in counts]:
        raise PlaceholderMismatch(
            f"{what}: placeholders do not match the images: image-token runs {runs} but {len(counts)} "
            f"image(s) needing {list(counts)} token(s)")
