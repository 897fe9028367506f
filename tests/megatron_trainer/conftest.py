"""Fixtures of the Megatron backend tests (megatron-core on CPU over gloo)."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

pytest.importorskip("megatron.core")

from megatron_helpers import save_tiny

warnings.filterwarnings("ignore", message=".*Transformer Engine and Apex are not installed.*")

_QUIET = (
    "ignore::DeprecationWarning:megatron",  # "tp_group is None, using default tp group" on every linear
    "ignore::UserWarning:megatron",  # "Apex is not installed. Falling back to Torch Norm", ...
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Silence megatron-core's per-call deprecation chatter in this directory's tests only."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.path).parents:
            for spec in _QUIET:
                item.add_marker(pytest.mark.filterwarnings(spec))


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """kind → directory of a saved tiny HF checkpoint (see `megatron_helpers.tiny_hf_model`)."""
    root = tmp_path_factory.mktemp("hf")
    return {kind: save_tiny(kind, root / kind) for kind in ("qwen2", "qwen3", "qwen3_moe", "llama")}


@pytest.fixture(scope="module")
def process_group() -> Iterator[None]:
    """A one-rank gloo world for in-process backends, torn down after the module (other suites may
    initialise torch.distributed themselves)."""
    import torch.distributed as dist

    owned = not dist.is_initialized()
    yield
    if owned and dist.is_initialized():
        from megatron.core import parallel_state as ps

        ps.destroy_model_parallel()
        dist.destroy_process_group()
