"""The image side of prompt loading (`engine.data.prompts.load_prompts`): per row, decode the images and
count their vision tokens, check the `<image>` markers against the images, render the prompt with the
model's vision block, and expand each image token to its count — or reject the row, counted in
`filtered_bad_image` / `filtered_image_mismatch` with one warning per kind naming the row (or a `DataError`
when `data.filter_overlong_prompts` is false).

The model's `ImageEncoder` is loaded on first use from the tokenizer's directory (`name_or_path`).
"""

from __future__ import annotations

import logging
from typing import Any

from engine.data.parquet import DataError, DataRow
from engine.multimodal.placeholders import count_placeholders, multimodal_messages, replace_placeholders

log = logging.getLogger("asyncrl.data")


def render_multimodal(prompt: list[dict[str, str]] | str, tokenizer: Any, vision_block: str,
                      chat_template: str | None = None,
                      template_kwargs: dict[str, Any] | None = None) -> tuple[str, bool]:
    """(text, uses_template) of a prompt with images: with a chat template (`chat_template`, else the
    tokenizer's), each `<image>` becomes an image item of a content list and the template renders the vision
    block; without one — or for a plain-string prompt — each `<image>` is replaced by `vision_block` and the
    contents are joined by newlines. `template_kwargs` (`data.apply_chat_template_kwargs`) go to the template."""
    template = chat_template or getattr(tokenizer, "chat_template", None)
    if isinstance(prompt, str) or not template:
        text = prompt if isinstance(prompt, str) else "\n".join(m["content"] for m in prompt)
        return replace_placeholders(text, vision_block), False
    text = tokenizer.apply_chat_template(multimodal_messages(prompt), chat_template=template, tokenize=False,
                                         add_generation_prompt=True, **(template_kwargs or {}))
    return str(text), True


class ImageRows:
    """The image side of `load_prompts` for one call: the model's encoder, the vision block and chat
    template, and the bad-row bookkeeping (`counters` is `load_prompts`' counter dict)."""

    def __init__(self, tokenizer: Any, encoder: Any, filter_bad: bool, counters: dict[str, int],
                 template_kwargs: dict[str, Any] | None = None) -> None:
        self.tokenizer = tokenizer
        self.template_kwargs = dict(template_kwargs or {})
        self._encoder = encoder
        self.filter_bad = filter_bad
        self.counters = counters
        self._warned: set[str] = set()
        self._block: str | None = None
        self._template: str | None = None
        self._template_read = False

    @property
    def encoder(self) -> Any:
        if self._encoder is None:
            from engine.multimodal.vision import ImageEncoder

            model_dir = str(getattr(self.tokenizer, "name_or_path", "") or "")
            try:
                self._encoder = ImageEncoder.for_model_dir(model_dir)
            except ValueError as exc:
                raise DataError(f"the data has images but the model cannot take them: {exc}") from exc
        return self._encoder

    def render(self, prompt: list[dict[str, str]] | str) -> tuple[str, bool]:
        """`render_multimodal` with the model's vision block and chat template (the tokenizer's, else the
        processor's `chat_template.jinja` / `chat_template.json` in the model directory)."""
        if self._block is None:
            spec = self.encoder.spec
            start, pad, end = self.tokenizer.convert_ids_to_tokens(
                [spec.vision_start_token_id, spec.image_token_id, spec.vision_end_token_id])
            self._block = f"{start}{pad}{end}"
        if not self._template_read:
            from engine.multimodal.vision import processor_chat_template

            self._template_read = True
            if not getattr(self.tokenizer, "chat_template", None):
                self._template = processor_chat_template(str(getattr(self.tokenizer, "name_or_path", "") or ""))
        return render_multimodal(prompt, self.tokenizer, self._block, self._template, self.template_kwargs)

    def reject(self, row: DataRow, kind: str, reason: str) -> None:
        """Count a bad row (warning once per kind), or raise when bad rows are not filtered."""
        if not self.filter_bad:
            raise DataError(f"{row.origin}: {reason} (set data.filter_overlong_prompts = true to skip such rows)")
        self.counters[f"filtered_{kind}"] += 1
        if kind not in self._warned:
            self._warned.add(kind)
            log.warning("%s: %s; dropping this row (later ones are only counted in data/filtered_%s)",
                        row.origin, reason, kind)

    def counts(self, row: DataRow) -> list[int] | None:
        """Vision-token count of each image of a row (decoding them), or None when the row is rejected:
        unreadable or corrupt images, or a number of `<image>` markers other than the number of images."""
        from engine.multimodal.images import ImageError

        if row.image_error is not None:
            self.reject(row, "bad_image", f"bad image: {row.image_error}")
            return None
        try:
            counts = [self.encoder.tokens(img) for img in row.images]
        except ImageError as exc:
            self.reject(row, "bad_image", f"bad image: {exc}")
            return None
        marks = count_placeholders(row.prompt)
        if marks != len(row.images):
            self.reject(row, "image_mismatch", f"placeholders do not match the images: the prompt has {marks} "
                        f"<image> placeholder(s) for {len(row.images)} image(s)")
            return None
        return counts

    def expand(self, row: DataRow, ids: list[int], counts: list[int]) -> list[int] | None:
        """`ids` with each image token expanded to its image's count, or None when the row is rejected."""
        from engine.multimodal.placeholders import PlaceholderMismatch, expand_image_tokens

        try:
            return expand_image_tokens(ids, self.encoder.spec.image_token_id, counts)
        except PlaceholderMismatch as exc:
            self.reject(row, "image_mismatch", f"placeholders do not match the images: {exc}")
            return None
