"""Fixtures: one tiny Qwen3-VL directory per session (built in a temporary cache, never the user's), its
tokenizer and image encoder, and figure images."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def vl_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from engine.models.tiny_vl import build_tiny_vl_model_dir

    return build_tiny_vl_model_dir(tmp_path_factory.mktemp("tiny_vl") / "model", seed=0)


@pytest.fixture(scope="session")
def vl_tokenizer(vl_dir: Path) -> Any:
    from engine.models.loader import load_tokenizer

    return load_tokenizer(vl_dir)


@pytest.fixture(scope="session")
def encoder(vl_dir: Path) -> Any:
    from engine.multimodal.vision import ImageEncoder

    return ImageEncoder.for_model_dir(str(vl_dir))


@pytest.fixture(scope="session")
def figure_images() -> list[str]:
    """Four distinct figures as `Prompt.images` entries (base64 PNG)."""
    from engine.data.figures import all_figures, render_png
    from engine.multimodal.images import encode_bytes

    figs = all_figures()
    return [encode_bytes(render_png(figs[i])) for i in (0, 130, 300, 530)]


@pytest.fixture
def tiny_text_lm() -> Any:
    """A tiny text-only Qwen2 (no tokenizer needed)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=16, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=32, pad_token_id=0, eos_token_id=1)
    return Qwen2ForCausalLM(config).eval()
