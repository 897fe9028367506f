"""The benchmark smoke tests: every study at toy size, in a temporary results directory."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # benchmarks/ lives at the repository root (not an installed package)


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    import torch

    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _kept_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A study's launched runs keep their records under the test's temporary directory, not the repository."""
    monkeypatch.setenv("ASYNCRL_BENCH_RUNS", str(tmp_path / "kept-runs"))


@pytest.fixture(scope="session")
def shared_ray() -> Iterator[None]:
    """One local Ray cluster for every study that needs one (each study reuses an initialised Ray)."""
    from benchmarks.engine_runs import ray_session

    with ray_session(object_store_bytes=512 * 2**20):
        yield
