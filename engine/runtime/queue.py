"""The bounded MessageQueue between rollouter and trainer: a deque of groups (Ray-free: the `MessageQueue` actor
in `engine.runtime.actors` wraps it; in one process it is the queue peer itself, `engine.runtime.peers_local`).

The rollouter pauses admission before the bound is reached (see `budget.py`), so eviction is a safety net:
a put into a full queue evicts the oldest group, which is returned to the caller to be accounted as dropped
(verl counts it in `dropped_samples`). `close()` marks the end of the stream; `get_batch` then returns what
is left.
"""

from __future__ import annotations

import threading
import time
from collections import deque

from engine.types import TrajectoryGroup


class MessageQueueCore:
    """Thread-safe bounded FIFO of TrajectoryGroups."""

    def __init__(self, max_size: int) -> None:
        self.max_size = max(1, int(max_size))
        self._items: deque[TrajectoryGroup] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self.total_put = 0
        self.total_evicted = 0

    def put(self, group: TrajectoryGroup) -> TrajectoryGroup | None:
        """Append; returns the evicted oldest group when the queue was full."""
        with self._cond:
            evicted = None
            if len(self._items) >= self.max_size:
                evicted = self._items.popleft()
                self.total_evicted += 1
            self._items.append(group)
            self.total_put += 1
            self._cond.notify_all()
            return evicted

    def get_batch(self, n: int, timeout: float) -> tuple[list[TrajectoryGroup], bool]:
        """Up to `n` groups, waiting at most `timeout` s for all `n`. Returns (groups, closed)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(self._items) < n and not self._closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    return [], False
                self._cond.wait(left)
            take = min(n, len(self._items))
            return [self._items.popleft() for _ in range(take)], self._closed and not self._items

    def size(self) -> int:
        with self._cond:
            return len(self._items)

    def min_version(self) -> int | None:
        with self._cond:
            return min((g.min_version for g in self._items), default=None)

    def drain(self) -> list[TrajectoryGroup]:
        with self._cond:
            items = list(self._items)
            self._items.clear()
            return items

    def peek_all(self) -> list[TrajectoryGroup]:
        with self._cond:
            return list(self._items)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def is_closed(self) -> bool:
        with self._cond:
            return self._closed

    def set_max_size(self, max_size: int) -> None:
        with self._cond:
            self.max_size = max(1, int(max_size))
