"""When the shared-prompt forward (`engine.trainer.shared_prefix`) is used — one rule for the trainer, which
applies it to each micro-batch, and `asyncrl plan`, which predicts it (pure Python: no torch here).

A micro-batch of padded rows [B, W] packs into G sequences (one per distinct prompt) of width L = the longest
|p| + Σ|r_i|; it is shared when B·W ≥ MIN_SAVING · G·L (the linear layers' work shrinks by that much at least)
and the dense additive mask [G, 1, L, L] takes at most MAX_MASK_BYTES.
"""

from __future__ import annotations

MIN_SAVING = 1.1
"""Share only when the padded rows hold at least this many times the tokens of the packed sequences."""
MAX_MASK_BYTES = 64 * 2**20
"""The largest dense attention mask [G, 1, L, L] the packing may build."""


def pays(padded_tokens: int, groups: int, width: int, mask_element_bytes: int = 4) -> bool:
    """Whether G = `groups` packed sequences of `width` tokens are worth forwarding instead of `padded_tokens`
    (module docstring)."""
    return (groups * width * width * mask_element_bytes <= MAX_MASK_BYTES
            and padded_tokens >= MIN_SAVING * groups * width)
