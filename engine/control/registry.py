"""The per-user registry of live runs on this machine: one small JSON file per run (pure Python, no Ray).

Every `asyncrl launch` gets a run id — its name plus a short random suffix (`tiny-cpu-3fa9c2`) — and, while
the driver lives, a file `<state dir>/runs/<id>.json` holding the id, name, run directory, Ray address, pid
(and the pid's start time, so a recycled pid is not mistaken for the run), host and start time. The state
dir is `$ASYNCRL_STATE_DIR`, else `$XDG_STATE_HOME/asyncrl`, else `~/.local/state/asyncrl`.

- Writes are atomic (`engine.persist.atomic`: a temporary file in the same directory, fsynced, then
  `os.replace`d into place), so a reader sees the old or the new entry, never half of one.
- Reads prune: an entry of this host whose pid is gone (a driver killed by `kill -9`) is deleted when read.
  Entries written on another host (a home directory shared over NFS) are never listed as live here.
- A clean exit of the driver (success, failure, Ctrl-C) removes its entry.
- `claim` checks for a live run of the same name and writes the new entry under an exclusive `flock`, so two
  launches racing for one name cannot both pass the check.

`resolve(query, entries)` turns what a user typed — a run id, a run name, or an id prefix — into exactly one
entry, and raises `AmbiguousRunError` listing the candidates (id, dir, started) otherwise.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from engine.control.errors import AmbiguousRunError, ControlError, RunNotFoundError
from engine.persist.atomic import atomic_write_json

STATE_ENV = "ASYNCRL_STATE_DIR"
SUFFIX_BYTES = 3  # 6 hex digits: 16.7 M ids per name


class NameInUse(ControlError):
    """A run of that name is live on this machine (launch refuses without `--allow-same-name`)."""


@dataclass
class RunEntry:
    """One live run, as recorded in the registry (and, plus history, in `<run_dir>/run.json`)."""

    id: str
    name: str
    run_dir: str | None = None
    address: str | None = None
    pid: int = field(default_factory=os.getpid)
    pid_start: int | None = None
    host: str = field(default_factory=socket.gethostname)
    started: float = field(default_factory=time.time)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunEntry:
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)

    def describe(self) -> str:
        """`<id> (dir <run_dir>, started <time>)` — how a candidate is named in an error."""
        return f"{self.id} (dir {self.run_dir or '?'}, started {format_time(self.started)})"


def format_time(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def state_dir() -> Path:
    """`$ASYNCRL_STATE_DIR`, else `$XDG_STATE_HOME/asyncrl`, else `~/.local/state/asyncrl`."""
    if os.environ.get(STATE_ENV):
        return Path(os.environ[STATE_ENV]).expanduser()
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base).expanduser() / "asyncrl"


def runs_dir() -> Path:
    return state_dir() / "runs"


def new_run_id(name: str, taken: Iterable[str] = ()) -> str:
    """`<name>-<6 hex digits>`, different from every id in `taken`."""
    used = set(taken)
    while True:
        rid = f"{name}-{secrets.token_hex(SUFFIX_BYTES)}"
        if rid not in used:
            return rid


def process_start(pid: int) -> int | None:
    """The start time of process `pid` in clock ticks since boot (Linux `/proc`; None elsewhere, or gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    try:
        return int(stat.rsplit(")", 1)[1].split()[19])  # field 22 of stat; fields after the name start at 3
    except (IndexError, ValueError):
        return None


def pid_alive(pid: int, start: int | None = None) -> bool:
    """True while process `pid` exists (and, when `start` is known, is that process, not a recycled pid)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    if start is not None:
        now = process_start(pid)
        if now is not None and now != start:
            return False
    return True


def _entry_path(run_id: str) -> Path:
    return runs_dir() / f"{run_id}.json"


def live_runs(prune: bool = True) -> list[RunEntry]:
    """The live runs of this host, oldest first; entries of dead pids are deleted (when `prune`)."""
    root = runs_dir()
    if not root.is_dir():
        return []
    here = socket.gethostname()
    out: list[RunEntry] = []
    for path in sorted(root.glob("*.json")):
        try:
            entry = RunEntry.from_json(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError):
            continue  # unreadable or foreign: never listed, never deleted
        if entry.host != here:
            continue
        if not pid_alive(entry.pid, entry.pid_start):
            if prune:
                with contextlib.suppress(OSError):
                    path.unlink()
            continue
        out.append(entry)
    return sorted(out, key=lambda e: (e.started, e.id))


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """An exclusive lock on the registry (flock on `runs/.lock`; a no-op where flock does not exist)."""
    root = runs_dir()
    root.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # not POSIX
        yield
        return
    with (root / ".lock").open("a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def name_in_use_message(name: str, live: list[RunEntry]) -> str:
    first = live[0]
    more = f" (and {len(live) - 1} more)" if len(live) > 1 else ""
    return (f"a run named {name!r} is already live on this machine: {first.id} in {first.run_dir or '?'} "
            f"(pid {first.pid}, started {format_time(first.started)}){more}; choose another name with "
            f"--name NAME (or --set name=NAME), or pass --allow-same-name")


def claim(name: str, *, allow_same_name: bool = False, run_dir: str | None = None,
          address: str | None = None) -> RunEntry:
    """Register a new run named `name` for this process and return its entry.

    Raises `NameInUse` (one line naming the live run and its dir) when a run of that name is live on this
    machine, unless `allow_same_name`.
    """
    with _locked():
        live = live_runs()
        same = [e for e in live if e.name == name]
        if same and not allow_same_name:
            raise NameInUse(name_in_use_message(name, same))
        taken = {p.stem for p in runs_dir().glob("*.json")}
        entry = RunEntry(id=new_run_id(name, taken), name=name, run_dir=run_dir, address=address,
                         pid_start=process_start(os.getpid()))
        atomic_write_json(_entry_path(entry.id), entry.to_json())
        return entry


def update(entry: RunEntry, **fields: Any) -> RunEntry:
    """Change fields of this run's entry (e.g. the Ray address once Ray is up) and rewrite it atomically."""
    for key, value in fields.items():
        setattr(entry, key, value)
    with _locked():
        atomic_write_json(_entry_path(entry.id), entry.to_json())
    return entry


def release(entry: RunEntry | None) -> None:
    """Remove this run's entry (a clean exit); missing is fine."""
    if entry is None:
        return
    with contextlib.suppress(OSError):
        _entry_path(entry.id).unlink()


def live_run_dirs() -> set[str]:
    """The run directories of the live runs (resolved), so a new run never shares one."""
    return {str(Path(e.run_dir).resolve()) for e in live_runs() if e.run_dir}


def match(query: str, entries: Iterable[RunEntry]) -> list[RunEntry]:
    """The entries `query` names: the one whose id it is; else those of that name; else those whose id starts
    with it."""
    entries = list(entries)
    exact = [e for e in entries if e.id == query]
    if exact:
        return exact
    named = [e for e in entries if e.name == query]
    if named:
        return named
    return [e for e in entries if e.id.startswith(query)]


def ambiguity_message(query: str | None, candidates: list[RunEntry], where: str = "on this machine") -> str:
    what = f"{query!r} matches {len(candidates)} live runs" if query else "several runs are live"
    listed = "; ".join(e.describe() for e in candidates)
    return f"{what} {where}: {listed} — name one by its id (a unique prefix is enough)"


def resolve(query: str | None, entries: Iterable[RunEntry], where: str = "on this machine") -> RunEntry:
    """Exactly one entry for `query` (None: the only live one). Raises `RunNotFoundError` or
    `AmbiguousRunError` (listing the candidates with id, dir and start time)."""
    entries = list(entries)
    found = entries if query is None else match(query, entries)
    if len(found) == 1:
        return found[0]
    if found:
        raise AmbiguousRunError(ambiguity_message(query, found, where))
    live = ", ".join(e.id for e in entries)
    listing = f"; live runs: {live}" if live else "; no asyncrl run is live"
    if query is None:
        raise RunNotFoundError(f"no asyncrl run is live {where} (start one with `asyncrl launch`)")
    raise RunNotFoundError(f"no run named {query!r} (nor one whose id starts so) is live {where}{listing}")


def write_run_file(run_dir: Path, entry: RunEntry, **extra: Any) -> Path:
    """`<run_dir>/run.json`: this launch's identity, plus the ids of earlier launches into the same dir."""
    path = Path(run_dir) / "run.json"
    previous: list[dict[str, Any]] = []
    try:
        old = json.loads(path.read_text(encoding="utf-8"))
        previous = list(old.get("previous", []))
        if old.get("id") and old.get("id") != entry.id:
            previous.append({k: old.get(k) for k in ("id", "started", "pid", "host")})
    except (OSError, ValueError, AttributeError):
        pass
    atomic_write_json(path, {**entry.to_json(), **extra, "previous": previous})
    return path
