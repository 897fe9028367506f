"""The tiny Qwen3-VL built offline: a loadable HF directory with its processor, deterministic in the seed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from engine.models.loader import is_vision_language, load_causal_lm, resolve_model_path
from engine.models.tiny_vl import build_tiny_vl_model, build_tiny_vl_tokenizer
from engine.multimodal.vision import VisionSpec, load_image_processor


def test_directory_loads_as_vision_language_model(vl_dir: Path, vl_tokenizer: Any) -> None:
    model = load_causal_lm(vl_dir)
    assert type(model).__name__ == "Qwen3VLForConditionalGeneration" and is_vision_language(model.config)
    assert type(load_image_processor(str(vl_dir))).__name__ == "Qwen2VLImageProcessorPil"
    spec = VisionSpec.from_model_dir(vl_dir)
    assert spec is not None and spec.merge_size == 2
    assert vl_tokenizer.convert_ids_to_tokens(spec.image_token_id) == "<|image_pad|>"
    assert vl_tokenizer.eos_token == "<|im_end|>" and vl_tokenizer.padding_side == "left"
    text = model.config.get_text_config()
    assert text.head_dim >= 32 and model.config.vision_config.hidden_size // model.config.vision_config.num_heads >= 32


def test_same_seed_same_weights() -> None:
    tok = build_tiny_vl_tokenizer()
    a, b, c = (build_tiny_vl_model(tok, seed=s) for s in (3, 3, 4))
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(sa["model.visual.patch_embed.proj.weight"], sc["model.visual.patch_embed.proj.weight"])


def test_builtin_name_builds_once_into_the_cache(tmp_path: Path) -> None:
    first = resolve_model_path("builtin:tiny-qwen3-vl", tmp_path, seed=1)
    assert first == resolve_model_path("builtin:tiny-qwen3-vl", tmp_path, seed=1)
    assert (first / "preprocessor_config.json").is_file() and (first / "model.safetensors").is_file()
