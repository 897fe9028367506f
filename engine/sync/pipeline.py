"""Double buffering for a weight sync: the next bucket is produced while the current one is consumed.

`ahead(items, depth)` runs the iterator `items` on a background thread, at most `depth` items ahead of the
consumer. On the sender, `items` gathers and packs bucket k+1 (Megatron gathers, the device → host copy, the
fingerprint) while the transport moves bucket k; on a receiver it receives bucket k+1 (a broadcast into a
fresh buffer, a `ray.get`) while bucket k is copied into the model. With depth 1 the sync then takes
≈ max(produce, consume) per bucket instead of their sum, and at most depth + 2 buckets exist at once on each
side (one being produced, `depth` waiting, one being consumed) — never the whole model.

Torch's copies, reductions and collectives release the GIL, so the two threads overlap. An exception of the
producer is raised in the consumer at the point it would have received the item; a consumer that stops early
(closes the generator) stops the producer at its next item.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")
_DONE = object()


class _Raised:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def ahead(items: Iterable[T], depth: int = 1) -> Iterator[T]:
    """`items`, produced on a thread up to `depth` items ahead (depth ≤ 0: no thread, `items` as is)."""
    if depth <= 0:
        yield from items
        return
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        try:
            for item in items:
                while not stop.is_set():
                    try:
                        q.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    break
        except BaseException as e:  # noqa: BLE001 - handed to the consumer
            q.put(_Raised(e))
            return
        finally:
            close = getattr(items, "close", None)
            if stop.is_set() and close is not None:
                close()
        q.put(_DONE)

    thread = threading.Thread(target=produce, name="asyncrl-sync-ahead", daemon=True)
    thread.start()
    try:
        while True:
            item = q.get()
            if item is _DONE:
                return
            if isinstance(item, _Raised):
                raise item.exc
            yield item
    finally:
        stop.set()
        while thread.is_alive():  # unblock a producer waiting on a full queue, then let it finish
            try:
                q.get(timeout=0.1)
            except queue.Empty:
                pass
        thread.join()
