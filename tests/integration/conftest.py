"""Integration tests: real local Ray clusters and the real tiny model on the built-in copy task."""

from pathlib import Path

import pytest


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return tmp_path / "run"
