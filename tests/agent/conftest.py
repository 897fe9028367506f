"""Shared by the sandbox tests that run as another user."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest


class Nobody(NamedTuple):
    """What a test needs to run Python as uid 65534: the system interpreter of this minor version (the venv's may
    sit under a 0700 home), this venv's site-packages and the checkout."""

    python: Path
    site: str
    repo: Path


@pytest.fixture
def nobody() -> Nobody:
    """Skips (with the reason) where uid 65534 cannot run this checkout: not root, no setpriv, no system
    interpreter, or a checkout / venv it cannot read (e.g. a clone under a 0700 home)."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv to switch to uid 65534")
    python = Path(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}")
    if not python.exists():
        pytest.skip(f"no {python} to run as another user")
    site = next(p for p in sys.path if p.endswith("site-packages") and Path(p, "numpy").exists())
    repo = Path(__file__).resolve().parents[2]
    readable = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", "test",
                               "-r", str(repo / "engine" / "agent" / "box.py"), "-a",
                               "-r", str(Path(site, "numpy", "__init__.py")), "-a", "-x", str(python)],
                              capture_output=True, timeout=30)
    if readable.returncode != 0:
        pytest.skip(f"uid 65534 cannot read {repo} or {site}")
    return Nobody(python, site, repo)
