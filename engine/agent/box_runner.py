"""The first code that runs inside a tool's box (`python -I -S -X utf8 /box/runner.py`): limits, then the tool.

Standard library only, nothing else importable when it starts: `-I` keeps the environment, the user's site
directory and the working directory off `sys.path`, `-S` keeps site-packages off, so no module the tool (or
an earlier call) could have planted is imported before the limits are set.

Protocol: the request is one JSON line on stdin (`answer_fd`, `module`, `function`, `arguments`, `paths`, `limits`,
`max_output_chars`, `uid`); the answer is one JSON line `{"status", "text", "limit"}` written to the inherited pipe
`answer_fd`. A request with `session` starts a stateful verl-style tool instead (`box_lib/box_session.py`: more
requests follow on stdin, one answer line each, until release).
Order of work:
1. read the request, and on a root host drop to the box's own uid (`uid`, never 0) — the box was built by a
   privileged bwrap, this is the point where it stops being root;
2. rlimits: CPU seconds (soft; the hard limit one second later kills), address space, processes (counted per
   uid: the uid is the box's own), file size, open files, no core files; SIGXFSZ ignored so a write past the
   file-size limit fails with EFBIG instead of killing the call;
3. `paths` appended after the standard library (the tool's module, numpy / sympy), then the tool imported and
   called with the arguments; what it prints is kept up to `max_output_chars` characters (the rest counted and
   dropped, never stored) and becomes the answer when the tool returns None.
Statuses: `ok`; `error` (the tool raised or returned a non-text value); `limit` (`memory`, `cpu`, `file_size`,
`processes`, `open_files`): a limit stopped it. The parent classifies what never reaches the answer pipe.
"""

import errno
import json
import os
import resource
import signal
import sys

ANSWER_FD = [3]
_LIMIT_ERRNOS = {errno.EFBIG: "file_size", errno.EAGAIN: "processes", errno.EMFILE: "open_files"}


class CpuLimit(BaseException):
    """Raised in the tool when its CPU seconds run out (SIGXCPU)."""


class Capture:
    """A text stream that keeps at most `cap` characters and counts the rest."""

    def __init__(self, cap: int) -> None:
        self.cap, self.parts, self.kept, self.dropped = cap, [], 0, 0

    def write(self, s: str) -> int:
        s = str(s)
        room = self.cap - self.kept
        if room > 0:
            self.parts.append(s[:room])
            self.kept += min(room, len(s))
        self.dropped += max(0, len(s) - max(room, 0))
        return len(s)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False

    def value(self) -> str:
        return "".join(self.parts)


def _send(status: str, text: str, limit: str | None = None, **extra) -> None:
    """Write one answer line (UTF-8, at most 4 bytes a character: lone surrogates become "?")."""
    text = str(text).encode("utf-8", errors="replace").decode("utf-8")
    data = (json.dumps({"status": status, "text": text, "limit": limit, **extra}, ensure_ascii=False)
            + "\n").encode()
    try:
        while data:
            data = data[os.write(ANSWER_FD[0], data):]
    except OSError:
        os._exit(0)  # the parent is gone


def _answer(status: str, text: str, limit: str | None = None) -> None:
    """Write the answer and exit."""
    _send(status, text, limit)
    os._exit(0)


def _limits(lim: dict) -> None:
    cpu = max(1, int(lim["cpu_s"]))
    mem = int(lim["memory_mb"]) * 1024 * 1024
    fsize = int(lim["file_mb"]) * 1024 * 1024
    for res, soft, hard in ((resource.RLIMIT_CPU, cpu, cpu + 1), (resource.RLIMIT_AS, mem, mem),
                            (resource.RLIMIT_NPROC, lim["processes"], lim["processes"]),
                            (resource.RLIMIT_FSIZE, fsize, fsize),
                            (resource.RLIMIT_NOFILE, lim["open_files"], lim["open_files"]),
                            (resource.RLIMIT_CORE, 0, 0)):
        resource.setrlimit(res, (soft, hard))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)

    def on_xcpu(signum, frame):
        raise CpuLimit()

    signal.signal(signal.SIGXCPU, on_xcpu)


def _failure(e: BaseException, cap: int) -> tuple[str, str, str | None]:
    """(status, text, limit) of a tool that raised `e`."""
    if isinstance(e, MemoryError):
        return "limit", "MemoryError: the tool ran out of its memory limit", "memory"
    if isinstance(e, CpuLimit):
        return "limit", "the tool ran out of its CPU-time limit", "cpu"
    if isinstance(e, OSError) and e.errno in _LIMIT_ERRNOS:
        return "limit", f"{type(e).__name__}: {e}", _LIMIT_ERRNOS[e.errno]
    return "error", _truncate(f"{type(e).__name__}: {e}", cap), None


def _truncate(text: str, cap: int, dropped: int = 0) -> str:
    if len(text) > cap or dropped:
        return text[:cap] + f"\n… [output truncated at {cap} characters]"
    return text


def main() -> None:
    req = json.loads(sys.stdin.buffer.readline(64 * 1024 * 1024).decode("utf-8", errors="replace"))
    ANSWER_FD[0] = int(req["answer_fd"])
    uid = req.get("uid")
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        if os.getuid() == 0 or os.geteuid() == 0:
            _answer("refused", "the tool box could not drop root")
    _limits(req["limits"])
    sys.path.extend(req["paths"])
    cap = int(req["max_output_chars"])
    if req.get("session") is not None:
        from box_session import serve  # on `paths` (engine/agent/box_lib): a stateful verl-style tool

        serve(req, cap, sys.modules[__name__])
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    out = Capture(cap)
    sys.stdout = sys.stderr = out
    try:
        import importlib

        fn = getattr(importlib.import_module(req["module"]), req["function"])
        result = fn(**req["arguments"])
    except BaseException as e:  # noqa: BLE001 - every failure of the tool is its answer
        _answer(*_failure(e, cap))
    printed = result is None
    if printed:
        result = out.value()
    if not isinstance(result, (str, int, float, bool)):
        _answer("error", f"tool returned {type(result).__name__}, not text")
    _answer("ok", _truncate(str(result), cap, out.dropped if printed else 0))


if __name__ == "__main__":
    main()
