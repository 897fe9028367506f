"""Tick thinning for categorical plotext axes (plotext drops colliding labels in an unstable order)."""

from __future__ import annotations

import math


def thin_ticks(positions: list[float], labels: list[str], width: int) -> tuple[list[float], list[str]]:
    """Every k-th tick, k the smallest step at which the labels (plus 2 spaces each) fit in `width` columns.

    The last tick is always kept, since it is the most recent step.
    """
    if not positions:
        return [], []
    need = max(len(label) for label in labels) + 2
    fits = max(1, width // need)
    step = max(1, math.ceil(len(positions) / fits))
    keep = list(range(len(positions) - 1, -1, -step))[::-1]
    return [positions[i] for i in keep], [labels[i] for i in keep]
