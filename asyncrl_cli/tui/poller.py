"""Coalescing between the polling thread and the UI thread.

The poll thread calls `source.snapshot(cursor)` every interval and `put`s the delta here; the UI drains
it when it handles the (replaceable) `SnapshotReady` message. If the UI falls behind, several deltas merge
into one: metrics and events are concatenated, the latest knobs/workers/state/run win — so no record is
lost even though only one message is ever pending.
"""

from __future__ import annotations

import threading
from typing import Any


class SnapshotBuffer:
    """Thread-safe merge of snapshot deltas awaiting the UI."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[str, Any] | None = None
        self._reset = False

    def put(self, snap: dict[str, Any], reset: bool = False) -> None:
        """Add a delta; `reset=True` discards anything older (the source restarted its cursor)."""
        with self._lock:
            if reset or self._pending is None:
                self._pending = {
                    **snap,
                    "metrics": list(snap.get("metrics") or []),
                    "events": list(snap.get("events") or []),
                }
                self._reset = self._reset or reset
                return
            merged = {**self._pending, **{k: v for k, v in snap.items() if k not in ("metrics", "events")}}
            merged["metrics"] = self._pending["metrics"] + list(snap.get("metrics") or [])
            merged["events"] = self._pending["events"] + list(snap.get("events") or [])
            self._pending = merged

    def drain(self) -> tuple[dict[str, Any] | None, bool]:
        """`(merged delta or None, whether the model must be reset first)`."""
        with self._lock:
            snap, reset = self._pending, self._reset
            self._pending, self._reset = None, False
            return snap, reset


def next_cursor(current: int, snap: dict[str, Any]) -> tuple[int, bool]:
    """The cursor to poll with next and whether the source restarted (its cursor went backwards)."""
    cursor = int(snap.get("cursor", current))
    return cursor, cursor < current
