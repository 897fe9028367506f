"""Dashboard test fixtures; event times render in UTC so snapshots match on every machine."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

from engine.control.client import LocalSource
from engine.control.core import ControllerCore
from tests.tui.helpers import live_core


@pytest.fixture(autouse=True)
def utc_clock() -> Iterator[None]:
    """Render event times in UTC during each dashboard test, then restore the process's zone."""
    before = os.environ.get("TZ")
    os.environ["TZ"] = "UTC"
    time.tzset()
    yield
    if before is None:
        del os.environ["TZ"]
    else:
        os.environ["TZ"] = before
    time.tzset()


@pytest.fixture
def core() -> ControllerCore:
    return live_core()


@pytest.fixture
def local(core: ControllerCore) -> LocalSource:
    return LocalSource(core, who="operator@test", label="127.0.0.1:6379")
