"""CliRunner fixtures for the `asyncrl` command line."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from asyncrl_cli.app import app

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Callable[..., Result]:
    """Run `asyncrl ARGS…` in a temporary working directory; returns the Click result."""
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()

    def invoke(*args: str) -> Result:
        return runner.invoke(app, [str(a) for a in args])

    return invoke
