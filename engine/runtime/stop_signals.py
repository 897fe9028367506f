"""How the driver hears that it must stop: SIGINT (Ctrl-C), SIGTERM (`kill`, a scheduler's preemption) and
SIGHUP (a closed terminal, a dropped SSH session) all ask for a graceful stop with a checkpoint; a second one
abandons the stop. A signal ignored when the driver started stays ignored: SIGHUP under `nohup`, SIGINT in a
shell script's background job (`cmd &` without job control).

The handlers raise `KeyboardInterrupt` in the main thread (the driver's supervision loop catches it) after
noting which signal came and when, for the stop line and the `stop` event. They are installed after
`ray.init`, whose own SIGTERM handler would end the process at once.

A closed terminal sends SIGHUP to its whole foreground process group, and the local Ray's `gcs_server` and
`raylet` are in it; they would die of it, and the driver with them, before any stop. So `ray.init` runs inside
`children_ignore_hangup()`: the processes it starts inherit SIGHUP ignored (an ignored signal survives `exec`),
as under `nohup`. (A SIGHUP during those seconds of start-up is lost; the run then goes on like a `nohup` one.)
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

STOP_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")


@dataclass
class StopSignals:
    """The stop signals received so far: `(name, time.time())` each, first first."""

    received: list[tuple[str, float]] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)  # ignored at start (nohup), so left ignored

    @property
    def first(self) -> tuple[str, float] | None:
        return self.received[0] if self.received else None

    def describe(self) -> str:
        """`SIGINT` / `SIGTERM` / ... of the first stop signal, or `Ctrl-C` when none was recorded."""
        return self.received[0][0] if self.received else "an interrupt"

    def _handler(self, signum: int, frame: Any) -> None:
        self.received.append((signal.Signals(signum).name, time.time()))
        raise KeyboardInterrupt

    def install(self) -> Callable[[], None]:
        """Handle the stop signals (main thread only); returns the undo."""
        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        previous: dict[int, Any] = {}
        for name in STOP_SIGNALS:
            sig = getattr(signal, name, None)
            if sig is None:  # SIGHUP does not exist on Windows
                continue
            if signal.getsignal(sig) is signal.SIG_IGN:
                self.ignored.append(name)
                continue
            previous[sig] = signal.signal(sig, self._handler)

        def undo() -> None:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

        return undo


@contextmanager
def children_ignore_hangup() -> Iterator[None]:
    """SIGHUP ignored in this block (main thread only), so processes started in it inherit it ignored."""
    sig = getattr(signal, "SIGHUP", None)
    if sig is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(sig, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(sig, previous)
