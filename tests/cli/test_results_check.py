"""`make lint`'s results check (scripts/check_results.py): `benchmarks/results/` holds one current JSON + PNG
per study, and an exploratory file beside them, a file of no study or a folder fails the check by name."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "check_results.py"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=REPO)


def test_the_tree_keeps_at_most_a_json_and_a_png_per_study() -> None:
    out = run()
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout == ""


def test_an_exploratory_file_beside_a_study_fails_naming_the_study_and_the_file(tmp_path: Path) -> None:
    for name in ("weight-sync.json", "weight-sync.png", "weight-sync-shm-ab7b-branch-idle-2.json",
                 "demo-seeds.json", "demo-sweep.json", "demo-sweep.png", "gpu_check.json"):
        (tmp_path / name).write_text("{}")
    out = run(str(tmp_path))
    assert out.returncode == 1
    lines = out.stdout.splitlines()
    assert len(lines) == 1, out.stdout
    assert lines[0].startswith("weight-sync: 3 files (")
    assert lines[0].endswith("git rm weight-sync-shm-ab7b-branch-idle-2.json")


def test_two_jsons_of_one_study_fail_even_without_a_png(tmp_path: Path) -> None:
    (tmp_path / "long-row.json").write_text("{}")
    (tmp_path / "long-row-28k-2l.json").write_text("{}")
    out = run(str(tmp_path))
    assert out.returncode == 1
    assert "long-row: 2 files" in out.stdout and "git rm long-row-28k-2l.json" in out.stdout


def test_a_file_of_no_study_and_a_folder_fail(tmp_path: Path) -> None:
    (tmp_path / "notes-from-tuesday.json").write_text("{}")
    (tmp_path / "staleness").mkdir()
    out = run(str(tmp_path))
    assert out.returncode == 1
    assert "notes-from-tuesday.json: belongs to no study" in out.stdout
    assert "staleness/: a folder" in out.stdout


def test_a_missing_folder_is_a_usage_error(tmp_path: Path) -> None:
    out = run(str(tmp_path / "nope"))
    assert out.returncode == 2
    assert "no such folder" in out.stderr
