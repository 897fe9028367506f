"""Suite-wide fixtures and settings.

- The registry of live runs (`engine.control.registry`) lives in a private directory for the test session,
  so test runs never see — or are refused because of — the user's own live runs, or another session's.
- A tiny random-init Qwen2 causal LM over raw token ids (no tokenizer needed: token ids are the vocabulary),
  and one torch thread for the folders that compare numbers on it. torch is imported only inside the
  fixtures, so the CLI and config tests do not pay for it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

import pytest

_STATE_DIR: str | None = None


def pytest_configure(config: object) -> None:
    global _STATE_DIR
    _STATE_DIR = tempfile.mkdtemp(prefix="asyncrl-state-")
    os.environ["ASYNCRL_STATE_DIR"] = _STATE_DIR


def pytest_unconfigure(config: object) -> None:
    if _STATE_DIR:
        shutil.rmtree(_STATE_DIR, ignore_errors=True)


PAD_ID, EOS_ID, VOCAB = 0, 1, 32

ONE_THREAD_FOLDERS = {"rollout", "sync"}
"""Test folders whose tests run torch on one thread (their own conftest may do the same for the others)."""


def build_tiny_lm(seed: int = 0, layers: int = 2) -> Any:
    """`engine.models.tiny.build_tiny_model` over raw token ids (VOCAB, pad PAD_ID, EOS EOS_ID), init range 0.1;
    also seeds the global RNG with `seed`, as the tests expect."""
    import torch

    from engine.models.tiny import build_tiny_model

    torch.manual_seed(seed)
    return build_tiny_model(VOCAB, PAD_ID, EOS_ID, seed=seed, layers=layers, initializer_range=0.1)


@pytest.fixture(autouse=True)
def _one_thread(request: pytest.FixtureRequest) -> None:
    if request.path.parent.name in ONE_THREAD_FOLDERS:
        import torch

        torch.set_num_threads(1)


@pytest.fixture
def tiny_lm() -> Callable[..., Any]:
    return build_tiny_lm
