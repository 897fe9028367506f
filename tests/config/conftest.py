"""Fixtures for config tests: write TOML files, and a minimal valid run config."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest


@pytest.fixture
def write(tmp_path: Path) -> Callable[[str, str], Path]:
    """Write a text file under tmp_path and return its path."""

    def _write(name: str, text: str) -> Path:
        p = tmp_path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8")
        return p

    return _write


@pytest.fixture
def minimal() -> str:
    """A complete, valid run config (everything else defaulted)."""
    return 'name = "t"\n[model]\npath = "builtin:tiny-qwen"\n[data]\ntrain_files = ["builtin:copy"]\n'
