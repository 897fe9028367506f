"""The driver's output: one writer for stdout and stderr that survives the terminal going away.

A run is launched as `asyncrl launch RUN.toml 2>&1 | tee run.log`, under `nohup`, with stdout closed (`>&-`),
into a file on a full disk, or in a terminal that is closed. Ctrl-C under `| tee` stops `tee` too, and the
driver's next write gets EPIPE (Python ignores SIGPIPE); a closed terminal gives EIO, a full disk ENOSPC or
EFBIG, a closed descriptor EBADF. None of these may stop the driver in the middle of its graceful stop.

`install()` puts a `GuardedStream` in place of `sys.stdout` and `sys.stderr`. It writes straight to the file
descriptor (no buffer that could fail again at exit); the first `OSError` marks the stream dead and every
later write, the failed one included, goes to `<run dir>/run.log` (`RunLog`; lines written before the run
directory exists wait in memory). A descriptor closed at start is reopened on `/dev/null` (so no file the
driver or Ray opens later takes its number) and counts as dead from the start. `RunLog.note` also appends the
driver's own `asyncrl:` lines (the stop and the resume command) to `run.log` while the terminal works, so the
run directory always holds them.
"""

from __future__ import annotations

import io
import os
import sys
import threading
from pathlib import Path
from typing import Any

RUN_LOG = "run.log"
PENDING_LIMIT = 1 << 20
"""Bytes kept in memory for `run.log` before the run directory exists (older text is dropped first)."""


class RunLog:
    """`<run dir>/run.log`: where output goes once the terminal is gone. Writing it never raises."""

    def __init__(self) -> None:
        self.path: Path | None = None
        self._pending: list[str] = []
        self._lock = threading.Lock()
        self.failed: list[str] = []  # the streams that died, with why ("stderr: BrokenPipeError")

    def attach(self, run_dir: str | Path) -> None:
        """Write to `<run_dir>/run.log` from now on (and what waited until now)."""
        with self._lock:
            self.path = Path(run_dir) / RUN_LOG
            pending, self._pending = "".join(self._pending), []
        if pending:
            self.write(pending)

    def write(self, text: str) -> None:
        with self._lock:
            if self.path is None:
                self._pending.append(text)
                while sum(map(len, self._pending)) > PENDING_LIMIT and len(self._pending) > 1:
                    self._pending.pop(0)
                return
            try:
                with open(self.path, "a", encoding="utf-8") as f:
                    f.write(text)
            except OSError:
                pass  # the run directory is unwritable too: nothing left to write to

    def note(self, text: str) -> None:
        """A driver line for `run.log` even while stderr works (once stderr is dead, its own copy lands there)."""
        if not any(f.startswith("stderr") for f in self.failed):
            self.write(text if text.endswith("\n") else text + "\n")


class _Bytes:
    """`GuardedStream.buffer`: the same guard for code that writes bytes (click does)."""

    def __init__(self, text: GuardedStream) -> None:
        self._text = text

    def write(self, data: bytes) -> int:
        self._text.write(bytes(data).decode("utf-8", errors="replace"))
        return len(data)

    def flush(self) -> None:
        pass

    def fileno(self) -> int:
        return self._text.fileno()

    def isatty(self) -> bool:
        return self._text.isatty()


class GuardedStream(io.TextIOBase):
    """A text stream whose writes never raise: on file descriptor `fd` (the process's own stdout / stderr,
    written unbuffered), or on `inner`, a stream put in their place before (a test's capture); after the first
    `OSError` (or when the descriptor was closed at start, `dead`) the writes go to `log` instead."""

    def __init__(self, fd: int, name: str, log: RunLog, dead: str | None = None, inner: Any = None) -> None:
        super().__init__()
        self._fd, self.name, self.log, self._inner = fd, name, log, inner
        self.dead: str | None = dead
        self.buffer = _Bytes(self)
        if dead:
            log.failed.append(f"{name}: {dead}")

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "utf-8"

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def isatty(self) -> bool:
        if self.dead:
            return False
        try:
            return self._inner.isatty() if self._inner is not None else os.isatty(self._fd)
        except (OSError, ValueError):
            return False

    def write(self, s: str) -> int:
        if not self.dead:
            try:
                if self._inner is not None:
                    self._inner.write(s)
                    self._inner.flush()
                    return len(s)
                data = s.encode("utf-8", errors="backslashreplace")
                while data:
                    data = data[os.write(self._fd, data):]
                return len(s)
            except (OSError, ValueError) as e:  # ValueError: a stream closed under us
                self.dead = type(e).__name__
                self.log.failed.append(f"{self.name}: {self.dead}")
                why = getattr(e, "strerror", None) or str(e)
                self.log.write(f"asyncrl: {self.name} is gone ({self.dead}: {why}); writing here instead\n")
        self.log.write(s)
        return len(s)

    def flush(self) -> None:
        pass


_installed: RunLog | None = None


def install() -> RunLog:
    """Guard `sys.stdout` and `sys.stderr` (again if something replaced them since) and return the run log they
    fall back to."""
    global _installed
    log = _installed = _installed or RunLog()
    closed = {fd: _reopen_if_closed(fd) for fd in (0, 1, 2)}
    for name, fd in (("stdout", 1), ("stderr", 2)):
        old = getattr(sys, name)
        if isinstance(old, GuardedStream):
            continue
        own = old is None or old is getattr(sys, f"__{name}__")
        try:
            if old is not None:
                old.flush()
        except (OSError, ValueError):
            pass
        dead = "closed at start" if closed[fd] and own else None
        setattr(sys, name, GuardedStream(fd, name, log, dead, inner=None if own else old))
    return log


def _reopen_if_closed(fd: int) -> bool:
    """Open `/dev/null` on `fd` if it is closed; True if it was."""
    try:
        os.fstat(fd)
        return False
    except OSError:
        pass
    null = os.open(os.devnull, os.O_RDWR)
    if null != fd:
        os.dup2(null, fd)
        os.close(null)
    return True


def say(text: str) -> None:
    """One driver line on stderr (guarded once `install()` ran) and in `<run dir>/run.log`."""
    print(text, file=sys.stderr, flush=True)
    if _installed is not None:
        _installed.note(text.lstrip("\n"))
