"""Shared fixtures of the vLLM tests: one tiny checkpoint and ONE engine for the whole session (a vLLM
engine start costs 15–50 s on this CPU), plus a helper that loads a fresh random weight set into it."""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@dataclass
class Tiny:
    """The checkpoint the engine started from."""

    path: Path
    model: Any  # transformers Qwen2ForCausalLM with the checkpoint's weights
    vocab_size: int
    eos_id: int
    pad_id: int


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Tiny:
    import torch
    from vllm_tiny_model import write_checkpoint

    torch.set_num_threads(1)
    path = tmp_path_factory.mktemp("tiny_qwen2")
    model, tokenizer = write_checkpoint(path, seed=0)
    return Tiny(path, model, len(tokenizer), tokenizer.eos_token_id, tokenizer.pad_token_id)


@pytest.fixture(scope="session")
def backend(tiny: Tiny) -> Iterator[Any]:
    from engine.rollout.vllm.backend import VLLMRolloutBackend

    be = VLLMRolloutBackend(
        tiny.path, dtype="float32", max_model_len=512, max_num_seqs=16, seed=0, kv_cache_gib=1, device="cpu"
    )
    yield be
    be.close()


_versions = itertools.count(1)


@pytest.fixture
def load_weights(backend: Any, tiny: Tiny) -> Callable[..., Any]:
    """`load_weights(seed, n_buckets=3, flat=False, quiet_eos=False) -> (model, version)`: a new random
    weight set, sent to the engine in `n_buckets` buckets without `lm_head.weight` (the backend must add the
    tied head); `flat`: as received `FlatBucket`s (what the sync delivers), else dicts packed by the backend. `quiet_eos` makes greedy decoding run to its budget (see `make_model`)."""
    from vllm_tiny_model import hf_buckets, make_model

    def load(
        seed: int, n_buckets: int = 3, flat: bool = False, quiet_eos: bool = False
    ) -> tuple[Any, int]:
        from engine.sync.flat import flat_buckets

        model = make_model(tiny.vocab_size, tiny.eos_id, tiny.pad_id, seed=seed, quiet_eos=quiet_eos)
        version = next(_versions)
        buckets = hf_buckets(model, n_buckets)
        backend.update_weights(list(flat_buckets(buckets)) if flat else buckets, version)
        return model, version

    return load
