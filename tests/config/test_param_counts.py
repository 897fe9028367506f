"""`init`'s parameter count by architecture (MHA/GQA/MLA attention; dense, MoE with routed + shared experts and
dense-first layers; tied/untied embeddings; vision towers) against the totals released models publish."""

from __future__ import annotations

import pytest

from asyncrl_cli.config.hf_model import facts_from_config
from tests.config.released_configs import RELEASED


@pytest.mark.parametrize("name", sorted(RELEASED))
def test_total_within_3_percent_of_the_published_total(name: str) -> None:
    cfg, published, _source = RELEASED[name]
    f = facts_from_config(cfg)
    assert f.params_total == pytest.approx(published, rel=0.03), f"{name}: {f.params_total / 1e9:.2f}B"
    assert f.counted_as is None  # a family read completely, not a generic estimate


@pytest.mark.parametrize(("name", "active"), [
    ("deepseek-ai/DeepSeek-V3", 37e9), ("mistralai/Mixtral-8x7B-v0.1", 12.9e9), ("Qwen/Qwen3-235B-A22B", 22e9),
    ("allenai/OLMoE-1B-7B-0924", 1.3e9), ("mistralai/Mixtral-8x22B-v0.1", 39e9),
    ("moonshotai/Kimi-K2-Instruct", 32e9), ("Qwen/Qwen3-Coder-480B-A35B-Instruct", 35e9),
])
def test_active_parameters_within_3_percent(name: str, active: float) -> None:
    assert facts_from_config(RELEASED[name][0]).params_active == pytest.approx(active, rel=0.03)


def test_mla_is_counted_as_mla_and_caches_the_compressed_kv() -> None:
    """DeepSeek-V3's attention is MLA: 187.1M parameters per layer; its KV cache holds 512 + 64 values per layer."""
    f = facts_from_config(RELEASED["deepseek-ai/DeepSeek-V3"][0])
    assert f.mla_kv_dim == 576 and f.kv_bytes_per_token(2, tp=8) == 61 * 576 * 2
    assert f.moe_layers == 58  # first_k_dense_replace = 3 of 61


def test_dense_first_layers_and_shared_experts() -> None:
    cfg = RELEASED["zai-org/GLM-4.5-Air"][0]
    f = facts_from_config(cfg)
    assert f.moe_layers == 45 and f.experts == 128 and f.experts_per_token == 8
    assert f.shared_experts_params == 45 * 3 * 4096 * 1408
    no_shared = facts_from_config({**cfg, "n_shared_experts": 0})
    assert f.params_total - no_shared.params_total == 45 * 3 * 4096 * 1408


def test_gemma_ties_its_embeddings_by_default_and_an_explicit_false_unties_them() -> None:
    cfg = RELEASED["google/gemma-2-9b"][0]
    tied, untied = facts_from_config(cfg), facts_from_config({**cfg, "tie_word_embeddings": False})
    assert tied.tied and not untied.tied and untied.params_total - tied.params_total == 256000 * 3584


def test_the_vision_tower_is_counted() -> None:
    f = facts_from_config(RELEASED["Qwen/Qwen2.5-VL-7B-Instruct"][0])
    assert 0.6e9 < f.params_vision < 0.7e9  # 32 blocks of 1280 wide + the merger: 676.6M


def test_an_unknown_vision_model_says_its_tower_is_not_counted() -> None:
    cfg = {**RELEASED["google/gemma-2-9b"][0], "model_type": "newvl", "vision_config": {"depth": 4}}
    assert "vision tower is not counted" in (facts_from_config(cfg).counted_as or "")
