"""Integration tests: real local Ray clusters and the real tiny model on the built-in copy task."""

from pathlib import Path

import pytest


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return tmp_path / "run"


@pytest.fixture(autouse=True)
def no_leftover_ray():
    """Each run starts (and shuts down) its own local Ray; a connection left behind would be joined instead."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    yield
