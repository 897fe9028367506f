"""Where the preset catalog is found: an explicit env path, the source tree, or an installed wheel's package data."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from asyncrl_cli.config.catalog import list_presets
from engine.plan import presets
from engine.plan.hardware import load_hardware

ROOT = Path(__file__).resolve().parents[2]
HW = '#:schema ../hardware.schema.json\ndevice = "cuda"\ngpus_per_node = 4\nmemory_gb = 48\n'


@pytest.mark.parametrize("var", ["ASYNCRL_PRESETS", "ASYNCRL_PRESETS_DIR"])
def test_an_env_path_names_the_catalog(var: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "hardware").mkdir()
    (tmp_path / "hardware" / "lab-l40.toml").write_text(HW)
    monkeypatch.delenv("ASYNCRL_PRESETS_DIR", raising=False)
    monkeypatch.setenv(var, str(tmp_path))
    assert presets.presets_dir() == tmp_path
    assert load_hardware("lab-l40").gpus_per_node == 4
    assert [r.ref for r in list_presets()] == ["hardware/lab-l40"]


def test_without_a_source_tree_the_packaged_copy_is_used(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for var in presets.ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(presets, "SOURCE_PRESETS", tmp_path / "no-checkout" / "presets")
    assert presets.presets_dir() == presets.PACKAGED_PRESETS
    assert load_hardware("cpu").device == "cpu"
    assert "runs/tiny-cpu" in {r.ref for r in list_presets("runs")}


def test_a_built_wheel_ships_the_presets(tmp_path: Path) -> None:
    """Build the wheel from a copy of the sources, unpack it as pip would, and resolve presets from there."""
    pytest.importorskip("setuptools", minversion="70.1")  # the dev extra installs it
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("asyncrl_cli", "engine", "presets"):
        shutil.copytree(ROOT / name, src / name, symlinks=True, ignore=ignore)
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", ".", "-w", str(tmp_path)],
        cwd=src, capture_output=True, text=True,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    site = tmp_path / "site"
    (wheel,) = tmp_path.glob("asyncrl-*.whl")
    zipfile.ZipFile(wheel).extractall(site)
    assert (site / "engine" / "sync" / "native" / "fused_copy.c").is_file()  # the native kernel's source ships
    code = (
        "from engine.plan.presets import presets_dir; from engine.plan.hardware import load_hardware\n"
        "from asyncrl_cli.config.catalog import list_presets\n"
        "print(presets_dir()); print(load_hardware('h100').device, len(list_presets('runs')))"
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site)}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    where, facts = out.stdout.split("\n")[:2]
    assert Path(where) == site / "engine" / "plan" / "_presets"
    assert facts == f"cuda {len(list(ROOT.glob('presets/runs/*.toml')))}"
