"""Suite-wide: the registry of live runs (`engine.runtime.run_registry`) lives in a private directory for the
test session, so test runs never see — or are refused because of — the user's own live runs, or another
session's."""

from __future__ import annotations

import os
import shutil
import tempfile

_STATE_DIR: str | None = None


def pytest_configure(config: object) -> None:
    global _STATE_DIR
    _STATE_DIR = tempfile.mkdtemp(prefix="asyncrl-state-")
    os.environ["ASYNCRL_STATE_DIR"] = _STATE_DIR


def pytest_unconfigure(config: object) -> None:
    if _STATE_DIR:
        shutil.rmtree(_STATE_DIR, ignore_errors=True)
