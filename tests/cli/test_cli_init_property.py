"""Property: over generated `config.json`s × GPU counts × hardware presets, every preset `init` writes validates
(exit 0), or `init` refuses with a one-line reason (exit 3) and writes nothing — never a preset `validate`
rejects. Plus the acceptance cases: Qwen3-235B-A22B on 256 H100s, Mixtral-8x7B on 16 and 32 H100s."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from asyncrl_cli.app import app
from tests.config.released_configs import RELEASED

HARDWARE = ["h100", "h200", "h20", "a100", "ascend-910b", "ascend-910c", "cpu"]


@st.composite
def model_configs(draw) -> dict:
    """A decoder config.json: GQA or MLA attention, dense or MoE (routed + shared experts, dense-first layers)."""
    heads = draw(st.sampled_from([8, 16, 32, 64, 128]))
    head_dim = draw(st.sampled_from([64, 128]))
    hidden = draw(st.sampled_from([512, 1024, 2048, 4096, 7168]))
    layers = draw(st.sampled_from([2, 12, 24, 28, 36, 46, 61, 94]))
    cfg = {"model_type": draw(st.sampled_from(["llama", "qwen3", "qwen3_moe", "deepseek_v3", "mixtral", "olmoe"])),
           "hidden_size": hidden, "num_attention_heads": heads, "num_hidden_layers": layers,
           "vocab_size": draw(st.sampled_from([32000, 151936])), "head_dim": head_dim,
           "num_key_value_heads": draw(st.sampled_from([h for h in (1, 2, 4, 8, heads) if heads % h == 0])),
           "intermediate_size": draw(st.sampled_from([1024, 4096, 14336, 18432])),
           "tie_word_embeddings": draw(st.booleans()), "max_position_embeddings": 40960}
    if draw(st.booleans()):  # MoE
        cfg |= {"num_experts": draw(st.sampled_from([8, 32, 64, 128, 256])), "num_experts_per_tok": 2,
                "moe_intermediate_size": draw(st.sampled_from([768, 1408, 2048])),
                "n_shared_experts": draw(st.sampled_from([0, 1])),
                "first_k_dense_replace": draw(st.sampled_from([0, 1, 3]))}
    if cfg["model_type"] == "deepseek_v3":  # MLA
        cfg |= {"q_lora_rank": draw(st.sampled_from([None, 1536])), "kv_lora_rank": 512, "qk_nope_head_dim": 128,
                "qk_rope_head_dim": 64, "v_head_dim": 128, "num_key_value_heads": heads}
    return cfg


def _init(tmp: Path, cfg: dict, dataset: str, hardware: str, gpus: int):
    model = tmp / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps(cfg))
    out = tmp / "run.toml"
    out.unlink(missing_ok=True)
    r = CliRunner().invoke(app, ["init", "-m", str(model), "-d", dataset, "--hardware", hardware,
                                 "--gpus", str(gpus), "-o", str(out)])
    return r, out


def _check(r, out: Path) -> None:
    assert r.exit_code in (0, 3), r.output
    if r.exit_code == 3:
        assert not out.exists()
        errors = [line for line in r.stderr.splitlines() if line.startswith("error")]
        assert len(errors) == 1 and errors[0].strip() != "error:", r.stderr
        return
    v = CliRunner().invoke(app, ["validate", str(out)])
    assert v.exit_code == 0, out.read_text() + v.output


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(cfg=model_configs(), gpus=st.sampled_from([2, 4, 8, 16, 24, 32, 64, 256, 1024]),
       hardware=st.sampled_from(HARDWARE), dataset=st.sampled_from(["gsm8k", "dapo-math", "copy"]))
def test_init_writes_only_presets_that_validate(tmp_path: Path, cfg: dict, gpus: int, hardware: str,
                                                dataset: str) -> None:
    r, out = _init(tmp_path, cfg, dataset, hardware, gpus)
    _check(r, out)


def test_qwen3_235b_gets_a_valid_preset_on_256_h100s(tmp_path: Path) -> None:
    r, out = _init(tmp_path, RELEASED["Qwen/Qwen3-235B-A22B"][0], "dapo-math", "h100", 256)
    assert r.exit_code == 0, r.output
    _check(r, out)
    t = tomllib.loads(out.read_text())["trainer"]
    assert t["backend"] == "megatron" and t["ep"] > 1 and 94 % t["pp"] == 0


@pytest.mark.parametrize("gpus", [16, 32])
def test_mixtral_8x7b_on_16_and_32_h100s_is_valid_or_refused_with_the_reason(tmp_path: Path, gpus: int) -> None:
    """The issue's case: at 32 GPUs init wrote ep = 8 with dp × cp = 12, and validate refused its own output."""
    r, out = _init(tmp_path, RELEASED["mistralai/Mixtral-8x7B-v0.1"][0], "gsm8k", "h100", gpus)
    _check(r, out)
    if r.exit_code == 3:
        assert "GB per GPU" in r.stderr
