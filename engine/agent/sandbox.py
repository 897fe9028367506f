"""Each tool call in a sandboxed subprocess: a wall-clock timeout, CPU and memory limits, no network.

A call runs `python -c _CHILD` in a new process session. The child:
- lowers its limits before it imports the tool (`RLIMIT_AS` = `memory_mb`, `RLIMIT_CPU` = the timeout + 1 s,
  no core files);
- installs an audit hook that refuses sockets, process creation and `ctypes` (PEP 578 hooks cannot be removed
  from Python code), so a tool has no network and cannot start a program unless `allow_network` is set;
  where the `unshare` program can give the child an empty network namespace (root, a permissive container),
  it runs inside one as well;
- imports `module:function`, calls it with the JSON arguments, and writes one JSON line of result on the
  real stdout (what the tool prints is captured and becomes the result when the tool returns None).

The parent kills the whole process group at the deadline. Every way a call can go wrong ends in a
`ToolOutcome` with a status (`ok`, `error`, `timeout`, `crashed`, `bad_output`) and the text the model is
shown — never in an exception: a tool can slow one trajectory, not wedge or kill the run.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

Status = Literal["ok", "error", "timeout", "crashed", "bad_output"]

_CHILD = r"""
import io, json, resource, sys
req = json.loads(sys.stdin.read())
mem = req["memory_mb"] * 1024 * 1024
resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
cpu = int(req["timeout_s"]) + 1
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
if not req["allow_network"]:
    _DENY = ("socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg", "socket.getaddrinfo",
             "subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
             "os.forkpty", "pty.spawn", "ctypes.dlopen", "ctypes.cdata")
    def _hook(event, args):
        if event in _DENY:
            raise PermissionError(f"{event} is not allowed in the tool sandbox")
    sys.addaudithook(_hook)
real_stdout = sys.stdout
sys.stdout = captured = io.StringIO()
try:
    import importlib
    module, _, name = req["function"].partition(":")
    fn = getattr(importlib.import_module(module), name)
    out = fn(**req["arguments"])
    sys.stdout = real_stdout
    if out is None:
        out = captured.getvalue()
    if not isinstance(out, (str, int, float, bool)):
        json.dump({"status": "bad_output", "text": f"tool returned {type(out).__name__}, not text"},
                  real_stdout)
    else:
        json.dump({"status": "ok", "text": str(out)}, real_stdout)
except BaseException as e:
    sys.stdout = real_stdout
    json.dump({"status": "error", "text": f"{type(e).__name__}: {e}"}, real_stdout)
real_stdout.write("\n")
real_stdout.flush()
"""


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one call. `timeout_s` is wall clock (verl's tool `default_timeout`)."""

    timeout_s: float = 10.0
    memory_mb: int = 1024
    max_output_chars: int = 4096
    allow_network: bool = False


@dataclass(frozen=True)
class ToolOutcome:
    """What became of one call: `text` is what the model is told, `status` what the metrics count."""

    status: Status
    text: str
    seconds: float

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@lru_cache(maxsize=1)
def _netns_prefix() -> tuple[str, ...]:
    """`unshare --net` when it works here (an empty network namespace), else nothing (the audit hook stays)."""
    exe = shutil.which("unshare")
    if exe is None:
        return ()
    try:
        ok = subprocess.run([exe, "--net", "true"], capture_output=True, timeout=5).returncode == 0
    except (OSError, subprocess.SubprocessError):
        ok = False
    return (exe, "--net") if ok else ()


def run_sandboxed(function: str, arguments: dict[str, Any], limits: SandboxLimits) -> ToolOutcome:
    """Run `module:function(**arguments)` in a sandboxed child and wait for it (at most `limits.timeout_s`)."""
    req = json.dumps({"function": function, "arguments": arguments, "memory_mb": limits.memory_mb,
                      "timeout_s": limits.timeout_s, "allow_network": limits.allow_network})
    prefix = () if limits.allow_network else _netns_prefix()
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen([*prefix, sys.executable, "-c", _CHILD], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                                text=True)
    except OSError as e:
        return ToolOutcome("crashed", f"tool could not start: {e}", time.monotonic() - t0)
    try:
        out, err = proc.communicate(req, timeout=limits.timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        proc.communicate()
        return ToolOutcome("timeout", f"tool timed out after {limits.timeout_s:g} s", time.monotonic() - t0)
    seconds = time.monotonic() - t0
    line = out.strip().splitlines()[-1] if out.strip() else ""
    try:
        result = json.loads(line)
        status, text = result["status"], str(result["text"])
    except (json.JSONDecodeError, KeyError, TypeError):
        why = f"killed by signal {-proc.returncode}" if proc.returncode < 0 else f"exit {proc.returncode}"
        tail = (err.strip().splitlines() or [""])[-1][:200]
        return ToolOutcome("crashed", f"tool crashed ({why}) {tail}".strip(), seconds)
    if status not in ("ok", "error", "bad_output"):
        return ToolOutcome("bad_output", "tool returned an unknown status", seconds)
    if len(text) > limits.max_output_chars:
        text = text[: limits.max_output_chars] + f"\n… [output truncated at {limits.max_output_chars} characters]"
    return ToolOutcome(status, text, seconds)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class ToolRunner:
    """Runs tool calls concurrently (`max_concurrent` at once) so other trajectories keep generating while
    one waits for its tool. `submit` returns a future that always resolves to a `ToolOutcome`."""

    def __init__(self, max_concurrent: int = 4) -> None:
        self._pool = ThreadPoolExecutor(max_workers=max_concurrent, thread_name_prefix="asyncrl-tool")

    def submit(self, function: str, arguments: dict[str, Any], limits: SandboxLimits) -> Future[ToolOutcome]:
        return self._pool.submit(run_sandboxed, function, arguments, limits)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
