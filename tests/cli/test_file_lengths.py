"""`make lint`'s length check (scripts/check_file_lengths.py): the tree is within the limit, and a file over it
is named with its length and fails the check."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "check_file_lengths.py"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=REPO)


def test_every_engine_cli_and_script_file_is_within_450_lines() -> None:
    out = run()
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout == ""


def test_a_file_over_the_limit_is_named_with_its_length_and_fails(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "long.py").write_text("x = 1\n" * 451)
    (tmp_path / "pkg" / "short.py").write_text("x = 1\n" * 450)
    (tmp_path / "pkg" / "no_newline.py").write_text("x = 1\n" * 450 + "y = 2")
    out = run(str(tmp_path))
    assert out.returncode == 1
    lines = out.stdout.splitlines()
    assert len(lines) == 2, out.stdout
    assert lines[0] == f"{tmp_path / 'pkg' / 'long.py'}: 451 lines (limit 450; split it by responsibility)"
    assert lines[1].startswith(f"{tmp_path / 'pkg' / 'no_newline.py'}: 451 lines")
    assert "short.py" not in out.stdout


def test_a_missing_folder_is_a_usage_error(tmp_path: Path) -> None:
    out = run(str(tmp_path / "nope"))
    assert out.returncode == 2
    assert "no such folder" in out.stderr
