"""Where a run writes and how it is continued (pure Python, no Ray).

- A new launch never overwrites a run: when the configured directory (`logging.run_dir`) is not empty, or a
  live run on this machine is using it, the run goes to a timestamped sibling `<dir>-YYYYmmdd-HHMMSS`
  (`-2`, `-3`, ... appended if that exists too).
- `--resume auto` continues the directory the run *last wrote to*: of the configured directory and its
  timestamped siblings, the one whose run files (`events.jsonl`, `metrics.jsonl`, `ledger.jsonl`,
  `run.json`) were modified last — the relaunch, not the older run it stepped aside from.
- The resume command printed at a stop, an interruption or a failure is the launch command as typed (run
  file, `--set`s, `--address`) with `--resume <that run's directory>`: it works when pasted.
"""

from __future__ import annotations

import datetime as _dt
import re
import shlex
from collections.abc import Iterable, Sequence
from pathlib import Path

STAMP = re.compile(r"\d{8}-\d{6}(-\d+)?")
RUN_FILES = ("events.jsonl", "metrics.jsonl", "ledger.jsonl", "run.json")
DEFAULT_COMMAND = ("asyncrl", "launch", "RUN.toml")


def _used(path: Path, taken: set[str]) -> bool:
    if str(path.resolve()) in taken:
        return True
    return path.exists() and (not path.is_dir() or any(path.iterdir()))


def prepare_run_dir(configured: str | Path, taken: Iterable[str] = (),
                    now: _dt.datetime | None = None) -> Path:
    """The directory a new run writes to (created): `configured` if it is empty and no live run (`taken`,
    resolved paths) uses it, else a timestamped sibling that is neither."""
    run_dir = Path(configured)
    busy = set(taken)
    if _used(run_dir, busy):
        stamp = (now or _dt.datetime.now()).strftime("%Y%m%d-%H%M%S")
        candidate, n = run_dir.with_name(f"{run_dir.name}-{stamp}"), 1
        while _used(candidate, busy):
            n += 1
            candidate = run_dir.with_name(f"{run_dir.name}-{stamp}-{n}")
        run_dir = candidate
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


def run_dir_family(configured: str | Path) -> list[Path]:
    """The configured run directory and its timestamped siblings (those that exist), configured first."""
    base = Path(configured)
    out = [base] if base.is_dir() else []
    if base.parent.is_dir():
        prefix = f"{base.name}-"
        out += sorted(p for p in base.parent.iterdir()
                      if p.is_dir() and p.name.startswith(prefix) and STAMP.fullmatch(p.name[len(prefix):]))
    return out


def last_write(run_dir: Path) -> float | None:
    """The newest modification time of the run's own files (None when it has none)."""
    times = [(run_dir / f).stat().st_mtime for f in RUN_FILES if (run_dir / f).is_file()]
    return max(times) if times else None


def last_written_run_dir(configured: str | Path) -> Path:
    """Of `configured` and its timestamped siblings, the one written last (`configured` if none was)."""
    written = [(t, str(p), p) for p in run_dir_family(configured) if (t := last_write(p)) is not None]
    return max(written)[2] if written else Path(configured)


def resume_command(command: Sequence[str] | None, run_dir: str | Path) -> str:
    """`command` (the launch as typed, without `--resume`) plus `--resume <run_dir>`, quoted for a shell."""
    args = [*(command or DEFAULT_COMMAND), "--resume", str(run_dir)]
    return " ".join(shlex.quote(a) for a in args)


def resume_hint(root: Path, run_dir: str | Path, command: Sequence[str] | None = None,
                trainer_died: bool = False) -> str:
    """What a resume would continue from and the command that does it (for the stop and failure lines)."""
    from engine.persist.checkpoint import latest_valid, step_of

    lost = ("the trainer's process is gone, so its weights could not be saved at the failure; "
            if trainer_died else "")
    latest = latest_valid(root)
    if latest is None:
        return f"{lost}no checkpoint exists, so the run cannot be resumed (set checkpoint.every_versions)"
    return f"{lost}resume from {latest} (step {step_of(latest)}) with: {resume_command(command, run_dir)}"
