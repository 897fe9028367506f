"""Messages from the polling thread to the app (posted with the thread-safe `post_message`)."""

from __future__ import annotations

from textual.message import Message


class SnapshotReady(Message):
    """New data is waiting in the app's `SnapshotBuffer`; a pending one makes a newer one redundant."""

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, SnapshotReady)


class SourceFailed(Message):
    """The last poll raised: `error` is the one-line reason shown in the disconnect banner."""

    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, SourceFailed)
