"""When the shared-prompt forward (`engine.trainer.shared_prefix`) is used — one rule for the trainer, which
applies it to each micro-batch, and `asyncrl plan` and the launch probe (`engine.plan.auto`), which predict it
(pure Python: no torch here).

A micro-batch of padded rows [B, W] packs into G sequences (one per distinct prompt) of width L = the longest
|p| + Σ|r_i|; it is shared when B·W ≥ MIN_SAVING · G·L (the linear layers' work shrinks by that much at least)
and the dense additive mask [G, 1, L, L] takes at most MAX_MASK_BYTES.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.config.schema import RunConfig

MIN_SAVING = 1.1
"""Share only when the padded rows hold at least this many times the tokens of the packed sequences."""
MAX_MASK_BYTES = 64 * 2**20
"""The largest dense attention mask [G, 1, L, L] the packing may build."""


def pays(padded_tokens: int, groups: int, width: int, mask_element_bytes: int = 4) -> bool:
    """Whether G = `groups` packed sequences of `width` tokens are worth forwarding instead of `padded_tokens`
    (module docstring)."""
    return (groups * width * width * mask_element_bytes <= MAX_MASK_BYTES
            and padded_tokens >= MIN_SAVING * groups * width)


def group_pays(n: int, prompt_tokens: int, padded_response: int, response_tokens: float) -> bool:
    """Whether one group of `n` rows is shared: its n padded rows of `prompt_tokens` + `padded_response` tokens
    against one sequence of the prompt and n responses of `response_tokens` (the typical group that `asyncrl plan`
    and the launch probe reason about)."""
    return pays(n * (prompt_tokens + padded_response), 1, round(prompt_tokens + n * response_tokens))


def may_share(cfg: RunConfig) -> bool:
    """Whether `cfg`'s trainer uses the shared-prompt forward at all: `trainer.shared_prompt` on a torch / FSDP2
    backend (Megatron forwards padded rows), text rows (no `data.image_key`), groups of more than one row."""
    return (cfg.trainer.backend != "megatron" and cfg.trainer.shared_prompt and cfg.data.image_key is None
            and cfg.rollout.n > 1)
