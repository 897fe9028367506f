"""Where a launch writes, which directory `--resume auto` continues, and the pasteable resume command."""

from __future__ import annotations

import datetime as dt
import os
import shlex
from pathlib import Path

from engine.persist.run_dirs import last_written_run_dir, prepare_run_dir, resume_command

NOW = dt.datetime(2026, 12, 1, 20, 15, 2)


def _touch(path: Path, mtime: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{}\n")
    os.utime(path, (mtime, mtime))


def test_a_used_or_live_run_dir_is_never_reused(tmp_path: Path) -> None:
    base = tmp_path / "runs" / "tiny-cpu"
    assert prepare_run_dir(base, now=NOW) == base  # new: used as configured
    assert prepare_run_dir(base, now=NOW) == base  # still empty
    (base / "events.jsonl").write_text("{}\n")
    first = prepare_run_dir(base, now=NOW)
    assert first == base.with_name("tiny-cpu-20261201-201502") and first.is_dir()
    # a second launch in the same second, while the first has not written yet, and its dir is live
    second = prepare_run_dir(base, taken={str(first.resolve())}, now=NOW)
    assert second == base.with_name("tiny-cpu-20261201-201502-2")
    # an empty configured dir that a live run claimed is not shared either
    empty = tmp_path / "runs" / "empty"
    assert prepare_run_dir(empty, taken={str(empty.resolve())}, now=NOW).name == "empty-20261201-201502"


def test_resume_auto_continues_the_directory_written_last(tmp_path: Path) -> None:
    base = tmp_path / "runs" / "tiny-cpu"
    assert last_written_run_dir(base) == base  # nothing yet
    _touch(base / "events.jsonl", 1000)
    relaunch = base.with_name("tiny-cpu-20261201-201502")
    _touch(relaunch / "events.jsonl", 2000)
    _touch(base.with_name("tiny-cpu-old") / "events.jsonl", 9000)  # not a sibling of this run: ignored
    assert last_written_run_dir(base) == relaunch
    _touch(base / "metrics.jsonl", 3000)  # the first run was resumed since, and wrote last
    assert last_written_run_dir(base) == base


def test_the_resume_command_pastes_back_to_the_same_arguments(tmp_path: Path) -> None:
    launch = ["asyncrl", "launch", "presets/runs/tiny-cpu.toml", "--set", 'logging.run_dir="/tmp/a b"',
              "--allow-same-name"]
    run_dir = tmp_path / "runs" / "tiny cpu-20261201-201502"
    cmd = resume_command(launch, run_dir)
    assert shlex.split(cmd) == [*launch, "--resume", str(run_dir)]
