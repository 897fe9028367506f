"""The prompt stream of a run: epochs of the training prompts in their seeded order, capped at a total.

The order of epoch `e` is a pure function of (data.seed, e) (`load_prompts` shuffles per epoch with a seeded
generator), so the stream's position — (epoch, index within the epoch, prompts emitted) — is all a
checkpoint needs to continue it exactly. The stream does no I/O: when it reaches an epoch whose prompts it
does not hold, `needs()` names it, the rollout core emits `NeedPrompts(epoch)`, and the shell `deliver`s them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from engine.types import Prompt


class PromptStream:
    """The prompts of epoch 0, 1, ... as delivered (in `load_prompts`' seeded order), capped at `total`."""

    def __init__(self, total_epochs: int, total: int) -> None:
        self.total_epochs = total_epochs
        self.total = total
        self.emitted = 0
        self._epoch = -1
        self._order: list[Prompt] | None = []  # None: the current epoch's prompts are not delivered (a restore)
        self._pos = 0
        self._next: tuple[int, list[Prompt]] | None = None  # the next epoch's prompts, delivered ahead
        self._ended = False  # an epoch came back empty: the data is exhausted

    def needs(self) -> int | None:
        """The epoch whose prompts must be delivered before `next()` can go on (None: none is needed)."""
        if self._ended or self.emitted >= self.total:
            return None
        if self._order is None:
            return self._epoch
        if self._pos < len(self._order):
            return None
        e = self._epoch + 1
        if e >= self.total_epochs or (self._next is not None and self._next[0] == e):
            return None
        return e

    def deliver(self, epoch: int, prompts: list[Prompt]) -> None:
        """Epoch `epoch`'s prompts, in their order (empty: the data is exhausted)."""
        if epoch == self._epoch and self._order is None:
            self._order = list(prompts)
        else:
            self._next = (epoch, list(prompts))

    def next(self) -> Prompt | None:
        """The next prompt; None when the stream is exhausted or waits for prompts (`needs()` says which)."""
        if self._ended or self.emitted >= self.total or self._order is None:
            return None
        if self._pos >= len(self._order):
            e = self._epoch + 1
            if e >= self.total_epochs or self._next is None or self._next[0] != e:
                return None
            (self._epoch, self._order), self._pos, self._next = self._next, 0, None
            if not self._order:
                self._ended = True
                return None
        p = self._order[self._pos]
        self._pos += 1
        self.emitted += 1
        return p

    def state(self) -> dict[str, int]:
        return {"epoch": self._epoch, "pos": self._pos, "emitted": self.emitted}

    def restore(self, state: dict[str, int]) -> None:
        """Fast-forward to a saved position; the current epoch's prompts are needed again (same order)."""
        self._epoch = state["epoch"]
        self._order = None if self._epoch >= 0 else []
        self._pos = state["pos"]
        self.emitted = state["emitted"]


def prompts_of(stream: PromptStream, prompts_for_epoch: Callable[[int], list[Prompt]]) -> Iterator[Prompt]:
    """Every prompt `stream` emits, each epoch it needs delivered from `prompts_for_epoch` (an in-memory
    source: tests and tools; a run's shell delivers on `NeedPrompts`)."""
    while True:
        need = stream.needs()
        if need is not None:
            stream.deliver(need, prompts_for_epoch(need))
            continue
        p = stream.next()
        if p is None:
            return
        yield p
