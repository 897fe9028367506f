"""Fixtures shared by the rollout tests that run real Ray actors."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="module")
def ray_local():
    """A local Ray for this module's actors (2 CPUs, a 256 MiB object store), shut down after it unless one was
    already running."""
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR",
                 object_store_memory=256 * 2**20)
    yield ray
    if started:
        ray.shutdown()
