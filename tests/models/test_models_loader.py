"""Resolving `model.path` and loading tokenizers / causal LMs offline, with one-line errors."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from engine.models.loader import load_causal_lm, load_tokenizer, resolve_model_path


def _copy(src: Path, dst: Path, **config_edits: object) -> Path:
    shutil.copytree(src, dst)
    if config_edits:
        cfg = json.loads((dst / "config.json").read_text())
        cfg.update(config_edits)
        (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_builtin_tiny_is_built_once_and_reused(tmp_path: Path) -> None:
    first = resolve_model_path("builtin:tiny-qwen", tmp_path, seed=3)
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    again = resolve_model_path("builtin:tiny-qwen", tmp_path, seed=3)
    assert again == first and (again / "model.safetensors").stat().st_mtime_ns == stamp
    assert resolve_model_path("builtin:tiny-qwen", tmp_path, seed=4) != first
    assert os.environ.get("HF_HUB_OFFLINE") == "1"
    leftovers = [p.name for p in first.parent.iterdir() if "tmp" in p.name]
    assert leftovers == []


def test_load_local_dir_eval_fp32_left_padding(tiny_dir: Path) -> None:
    model = load_causal_lm(tiny_dir)
    assert not model.training
    assert next(model.parameters()).dtype == torch.float32
    assert load_causal_lm(str(tiny_dir), dtype="bfloat16").lm_head.weight.dtype == torch.bfloat16
    tok = load_tokenizer(tiny_dir)
    assert tok.padding_side == "left" and tok.pad_token_id is not None


def test_dir_without_weights(tmp_path: Path, tiny_dir: Path) -> None:
    bad = _copy(tiny_dir, tmp_path / "noweights")
    (bad / "model.safetensors").unlink()
    with pytest.raises(ValueError, match="no weights") as err:
        load_causal_lm(bad)
    assert "\n" not in str(err.value)


def test_dir_without_config(tmp_path: Path, tiny_dir: Path) -> None:
    bad = _copy(tiny_dir, tmp_path / "noconfig")
    (bad / "config.json").unlink()
    with pytest.raises(ValueError, match="no config.json"):
        load_causal_lm(bad)


@pytest.mark.parametrize(
    "edits, expected",
    [
        ({"intermediate_size": 256}, "mismatched keys"),
        ({"num_hidden_layers": 1, "layer_types": ["full_attention"]}, "unexpected keys"),
        ({"num_hidden_layers": 3, "layer_types": ["full_attention"] * 3}, "missing keys"),
    ],
)
def test_config_that_does_not_match_weights(
    tmp_path: Path, tiny_dir: Path, edits: dict, expected: str
) -> None:
    bad = _copy(tiny_dir, tmp_path / "bad", **edits)
    with pytest.raises(ValueError, match="does not match the weights") as err:
        load_causal_lm(bad)
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_hub_id_is_a_clear_offline_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="no model-hub access") as err:
        resolve_model_path("Qwen/Qwen2.5-0.5B-Instruct", tmp_path)
    assert "model.path" in str(err.value)


def test_missing_dir_file_path_and_unknown_builtin(tmp_path: Path, tiny_dir: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        resolve_model_path(str(tmp_path / "nope"), tmp_path)
    with pytest.raises(ValueError, match="is a file"):
        resolve_model_path(str(tiny_dir / "config.json"), tmp_path)
    with pytest.raises(ValueError, match="builtin:tiny-qwen"):
        resolve_model_path("builtin:gpt5", tmp_path)
    with pytest.raises(ValueError, match="dtype"):
        load_causal_lm(tiny_dir, dtype="float8")
