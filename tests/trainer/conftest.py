"""Fixtures: a tiny random-init Qwen2 causal LM (no tokenizer needed: token ids are the vocabulary)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from trainer_helpers import build_tiny_lm


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


@pytest.fixture
def tiny_lm() -> Callable[..., torch.nn.Module]:
    return build_tiny_lm
