"""A private asyncio event loop running in a daemon thread, driven from synchronous code.

`run(coro)` submits a coroutine from any other thread and blocks until it finishes, so several threads
(a replica's generate thread and its control thread) can drive one async engine concurrently.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

_T = TypeVar("_T")


class LoopThread:
    """One event loop in one daemon thread; `close` stops it (idempotent)."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self.loop.is_closed()

    def run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        """Run `coro` on the loop and return its result (exceptions propagate to the caller)."""
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("LoopThread.run must not be called from the loop's own thread")
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def close(self, timeout: float = 30.0) -> None:
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=timeout)
        if not self.loop.is_closed() and not self.loop.is_running():
            self.loop.close()
