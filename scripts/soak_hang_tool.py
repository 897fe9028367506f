"""The soak's multi-turn tool (`scripts/soak.py`, arm `multi`): the built-in `lookup` (the row's secret, from its
`tools_kwargs.lookup.create_kwargs`), except that for every secret divisible by `HANG_EVERY` it never returns —
it sleeps forever (no CPU, so only the box's wall-clock deadline, `timeout_s`, can end it). Which calls hang
depends on the prompt alone, so a deterministic run with it is still a pure function of its config."""

from __future__ import annotations

import time

HANG_EVERY = 4
"""A quarter of the secrets hang."""


def lookup(secret: str = "") -> str:
    """The row's secret, or no answer at all when it is divisible by `HANG_EVERY`."""
    if not str(secret).strip().isdigit():
        raise ValueError("nothing to look up for this prompt")
    if int(secret) % HANG_EVERY == 0:
        while True:
            time.sleep(3600)
    return str(secret).strip()
