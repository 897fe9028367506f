"""Fixtures: a tiny random-init Qwen2 causal LM (no tokenizer needed: token ids are the vocabulary)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

PAD_ID, EOS_ID, VOCAB = 0, 1, 32


def build_tiny_lm(seed: int = 0, layers: int = 2) -> torch.nn.Module:
    """`engine.models.tiny.build_tiny_model` over raw token ids (VOCAB, pad PAD_ID, EOS EOS_ID), init range 0.1;
    also seeds the global RNG with `seed`, as the tests expect."""
    from engine.models.tiny import build_tiny_model

    torch.manual_seed(seed)
    return build_tiny_model(VOCAB, PAD_ID, EOS_ID, seed=seed, layers=layers, initializer_range=0.1)


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


@pytest.fixture
def tiny_lm() -> Callable[..., torch.nn.Module]:
    return build_tiny_lm
