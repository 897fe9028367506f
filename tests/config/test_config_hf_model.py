"""Parameter counts from config.json, against the published sizes (within 2 %)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asyncrl_cli.config.hf_model import (
    ModelConfigError,
    facts_from_config,
    find_config_json,
    read_model_facts,
)

ROOT = Path(__file__).resolve().parents[2]
HF_FIXTURES = Path(__file__).parent / "fixtures" / "hf"
REAL = ROOT / "asyncrl_cli" / "config" / "known_models"

# (config.json location, published total, published active)
PUBLISHED = [
    (REAL / "Qwen--Qwen3-30B-A3B-Base.json", 30.5e9, 3.3e9),
    (REAL / "Qwen--Qwen3-VL-8B-Instruct.json", 8.8e9, 8.8e9),
    (REAL / "Qwen--Qwen2.5-Math-7B.json", 7.62e9, 7.62e9),
    (REAL / "Qwen--Qwen3-8B-Base.json", 8.2e9, 8.2e9),
    (HF_FIXTURES / "llama-3-8b", 8.03e9, 8.03e9),
    (HF_FIXTURES / "qwen2.5-7b", 7.62e9, 7.62e9),
    (HF_FIXTURES / "mixtral-8x7b", 46.7e9, 12.9e9),
    (HF_FIXTURES / "qwen3-0.6b", 0.6e9, 0.6e9),
]


@pytest.mark.parametrize(("where", "total", "active"), PUBLISHED, ids=lambda x: getattr(x, "name", ""))
def test_counts_match_published_sizes(where: Path, total: float, active: float) -> None:
    f = read_model_facts(str(where))
    assert f.params_total == pytest.approx(total, rel=0.02)
    assert f.params_active == pytest.approx(active, rel=0.02)


def test_shared_fixture_configs_match_the_seed_sizes() -> None:
    shared = Path("/work/shared/fixtures/hf-configs")
    if not shared.is_dir():
        pytest.skip("shared fixtures not mounted")
    moe = read_model_facts(str(shared / "qwen3-30b-a3b-base"))
    vl = read_model_facts(str(shared / "qwen3-vl-8b-instruct"))
    assert (moe.params_total, moe.params_active) == (
        pytest.approx(30.5e9, rel=0.02),
        pytest.approx(3.3e9, rel=0.02),
    )
    assert vl.params_total == pytest.approx(8.8e9, rel=0.02)
    assert vl.params_total - vl.params_vision == pytest.approx(8.2e9, rel=0.02)


def test_vl_facts_describe_the_language_model() -> None:
    f = read_model_facts(str(REAL / "Qwen--Qwen3-VL-8B-Instruct.json"))
    assert (f.layers, f.hidden, f.heads, f.kv_heads, f.head_dim, f.vocab) == (36, 4096, 32, 8, 128, 151936)
    assert f.params_vision == pytest.approx(0.58e9, rel=0.03)
    assert not f.is_moe


def test_moe_facts_and_kv_bytes() -> None:
    f = read_model_facts(str(REAL / "Qwen--Qwen3-30B-A3B-Base.json"))
    assert (f.experts, f.experts_per_token, f.moe_layers) == (128, 8, 48)
    # 2 (K,V) · 48 layers · 4 kv heads · 128 · 2 bytes; tp 4 leaves one kv head per GPU
    assert f.kv_bytes_per_token(2) == 2 * 48 * 4 * 128 * 2
    assert f.kv_bytes_per_token(2, tp=4) == 2 * 48 * 1 * 128 * 2


def test_tied_embeddings_are_counted_once() -> None:
    cfg = json.loads((HF_FIXTURES / "qwen3-0.6b" / "config.json").read_text())
    tied = facts_from_config(cfg)
    untied = facts_from_config({**cfg, "tie_word_embeddings": False})
    assert untied.params_total - tied.params_total == cfg["vocab_size"] * cfg["hidden_size"]


def test_mlp_only_layers_are_dense() -> None:
    cfg = json.loads((REAL / "Qwen--Qwen3-30B-A3B-Base.json").read_text())
    f = facts_from_config({**cfg, "mlp_only_layers": [0, 1]})
    assert f.moe_layers == 46


def test_unknown_architecture_is_counted_as_dense_with_a_note() -> None:
    cfg = json.loads((HF_FIXTURES / "llama-3-8b" / "config.json").read_text())
    f = facts_from_config({**cfg, "model_type": "somethingnew"})
    assert f.counted_as is not None
    assert f.params_total == pytest.approx(8.03e9, rel=0.02)


def test_missing_config_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ModelConfigError, match="no config.json"):
        read_model_facts(str(tmp_path / "nothing-here"))
    with pytest.raises(ModelConfigError, match="built in process"):
        read_model_facts("builtin:tiny-qwen")


def test_hub_cache_is_read_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    snap = tmp_path / "hub" / "models--acme--Tiny-7B" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text((HF_FIXTURES / "qwen2.5-7b" / "config.json").read_text())
    (tmp_path / "hub" / "models--acme--Tiny-7B" / "refs").mkdir()
    (tmp_path / "hub" / "models--acme--Tiny-7B" / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert find_config_json("acme/Tiny-7B") == snap / "config.json"
    assert read_model_facts("acme/Tiny-7B").params_total == pytest.approx(7.62e9, rel=0.02)
