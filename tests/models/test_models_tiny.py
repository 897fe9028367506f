"""The in-process tiny Qwen2 model and its trained tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from engine.data.builtin import BUILTIN_TASKS, builtin_rows
from engine.models.tiny import build_tiny_model_dir, build_tiny_tokenizer


def _texts(task: str) -> list[str]:
    rows = builtin_rows(task, "train", seed=0, size=300) + builtin_rows(task, "val", seed=0)
    prompts = ["\n".join(m["content"] for m in r["prompt"]) for r in rows]
    return prompts + [r["reward_model"]["ground_truth"] for r in rows]


@pytest.mark.parametrize("tasks", [("copy", "reverse"), BUILTIN_TASKS])
def test_tokenizer_round_trips_every_builtin_prompt(tasks: tuple[str, ...]) -> None:
    tok = build_tiny_tokenizer(tasks)
    for task in tasks:
        for text in _texts(task):
            ids = tok(text, add_special_tokens=False)["input_ids"]
            assert tok.unk_token_id not in ids, text
            assert tok.decode(ids) == text


def test_default_tokenizer_is_small_and_digit_level() -> None:
    tok = build_tiny_tokenizer()
    assert len(tok) <= 32  # the RL recipe relies on a small vocabulary
    ids = tok("copy 381=", add_special_tokens=False)["input_ids"]
    assert tok.convert_ids_to_tokens(ids)[-4:] == ["3", "8", "1", "="]
    assert tok.padding_side == "left"
    assert (tok.pad_token, tok.eos_token) == ("<pad>", "<eos>")
    # a response "381<eos>" decodes to the bare answer the reward expects
    resp = tok.convert_tokens_to_ids(["3", "8", "1"]) + [tok.eos_token_id]
    assert tok.decode(resp, skip_special_tokens=True) == "381"


def test_tokenizer_is_deterministic() -> None:
    assert build_tiny_tokenizer().get_vocab() == build_tiny_tokenizer().get_vocab()


def test_model_dir_loads_with_plain_transformers(tiny_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    names = {p.name for p in tiny_dir.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    cfg = model.config
    assert cfg.model_type == "qwen2"
    assert cfg.head_dim >= 32 and cfg.hidden_size == 128 and cfg.num_hidden_layers == 2
    assert cfg.num_key_value_heads == 1 and cfg.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert cfg.vocab_size == len(tok) and cfg.eos_token_id == tok.eos_token_id
    assert tok.padding_side == "left"
    n_params = sum(p.numel() for p in model.parameters())
    assert 400_000 < n_params < 600_000
    batch = tok(["copy 381=", "rev 12="], return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=4, do_sample=False, pad_token_id=tok.pad_token_id)
    prompt_len = batch["input_ids"].shape[1]
    assert torch.equal(out[:, :prompt_len], batch["input_ids"])
    assert prompt_len < out.shape[1] <= prompt_len + 4


def test_same_seed_same_weights_other_seed_differs(tmp_path: Path, tiny_dir: Path) -> None:
    from safetensors.torch import load_file

    again = build_tiny_model_dir(tmp_path / "again", seed=0)
    other = build_tiny_model_dir(tmp_path / "other", seed=1)
    a, b, c = (load_file(d / "model.safetensors") for d in (tiny_dir, again, other))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"])
    meta = json.loads((other / "asyncrl_tiny.json").read_text())
    assert meta["seed"] == 1 and meta["layers"] == 2
