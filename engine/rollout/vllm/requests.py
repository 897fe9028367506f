"""The request side of the vLLM backend (`engine.rollout.vllm.backend`): one request in flight (`_Flight`),
the checks a `GenRequest` must pass, vLLM's finish reasons mapped onto ours, and the image-placeholder collapse.

Images. vLLM's multimodal processor expands a token prompt itself: it replaces each image's *first* placeholder
by the image's vision-token count, so a run already expanded to n (`engine.multimodal`) would grow to 2n − 1.
`collapse_image_placeholders` cuts each run to one placeholder, which the engine expands back to the same n.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.types import FinishReason, GenRequest

__all__ = ["_Flight", "_check", "_finish_reason", "collapse_image_placeholders"]


@dataclass
class _Flight:
    """One request in flight on the engine, accumulated from vLLM's delta outputs."""

    request: GenRequest
    engine_id: str
    """The id of its current engine request (a new one each time an emulated "keep" pause resubmits it)."""
    tokens: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    first_version: int | None = None
    last_version: int | None = None
    key: str = ""
    """Its key in `_flights` (its first engine id)."""
    cancelled: bool = False
    """Aborted by the caller: never resubmitted."""


def _finish_reason(vllm_reason: str | None) -> FinishReason:
    if vllm_reason in ("stop", "length"):
        return vllm_reason  # type: ignore[return-value]
    return "abort"


def _check(req: GenRequest) -> None:
    if not req.prompt_ids:
        raise ValueError(f"request {req.request_id!r} has an empty prompt")
    if len(req.prefix_log_probs) != len(req.prefix_ids):
        raise ValueError(
            f"request {req.request_id!r}: {len(req.prefix_ids)} prefix tokens but "
            f"{len(req.prefix_log_probs)} prefix log-probs"
        )


def collapse_image_placeholders(token_ids: list[int], image_token_id: int) -> list[int]:
    """`token_ids` with each run of `image_token_id` cut to one: the form vLLM's multimodal processor expands
    (this module's docstring, "Images"). Each image's placeholders must be one run of their own (the chat template puts
    `<|vision_start|>` / `<|vision_end|>` around each); runs that touch would merge, and vLLM then refuses the
    request for finding fewer placeholders than images."""
    out: list[int] = []
    for token in token_ids:
        if token == image_token_id and out and out[-1] == image_token_id:
            continue
        out.append(token)
    return out
