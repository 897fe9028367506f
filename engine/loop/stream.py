"""The prompt stream of a run: epochs of the training prompts in their seeded order, capped at a total.

The order of epoch `e` is a pure function of (data.seed, e) (`load_prompts` shuffles per epoch with a seeded
generator), so the stream's position — (epoch, index within the epoch, prompts emitted) — is all a
checkpoint needs to continue it exactly.
"""

from __future__ import annotations

from collections.abc import Callable

from engine.types import Prompt


class PromptStream:
    """The prompts of epoch 0, 1, ... in the order `load_prompts` gives (it shuffles per epoch, seeded), capped
    at `total` prompts. The order is a pure function of (seed, epoch), so a position restores exactly."""

    def __init__(self, prompts_for_epoch: Callable[[int], list[Prompt]], total_epochs: int, total: int) -> None:
        self._for_epoch = prompts_for_epoch
        self.total_epochs = total_epochs
        self.total = total
        self.emitted = 0
        self._epoch = -1
        self._order: list[Prompt] = []
        self._pos = 0

    def next(self) -> Prompt | None:
        if self.emitted >= self.total:
            return None
        if self._pos >= len(self._order):
            self._epoch += 1
            if self._epoch >= self.total_epochs:
                return None
            self._order = list(self._for_epoch(self._epoch))
            self._pos = 0
            if not self._order:
                return None
        p = self._order[self._pos]
        self._pos += 1
        self.emitted += 1
        return p

    def state(self) -> dict[str, int]:
        return {"epoch": self._epoch, "pos": self._pos, "emitted": self.emitted}

    def restore(self, state: dict[str, int]) -> None:
        """Fast-forward to a saved position (the order is a pure function of seed and epoch)."""
        self._epoch = state["epoch"]
        if self._epoch >= 0:
            self._order = list(self._for_epoch(self._epoch))
        self._pos = state["pos"]
        self.emitted = state["emitted"]

