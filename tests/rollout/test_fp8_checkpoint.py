"""The block-FP8 checkpoint an fp8 vLLM replica starts from (`engine.rollout.vllm.fp8_checkpoint`): written once
from the trainer's checkpoint with DeepSeek-V3's `quantization_config`, its tensors exactly what a version-0 sync
sends (the same quantiser on the same rollout-dtype weights), the tokenizer files beside them; a released FP8
checkpoint is used as it is; the engine arguments point vLLM at it with `quantization = "fp8"`."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from engine.rollout.vllm.engine_args import engine_args, fp8_model
from engine.rollout.vllm.fp8_checkpoint import fp8_checkpoint, is_block_fp8
from engine.sync.fp8 import QUANTIZATION_CONFIG, quantize_bucket


def write_tiny(out: Path) -> dict[str, torch.Tensor]:
    """A 2-layer Qwen2 checkpoint's files (HF names, fp32, tied head), written with safetensors directly."""
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)
    h, f = 128, 256
    shapes = {"model.embed_tokens.weight": (300, h), "model.norm.weight": (h,)}
    for i in range(2):
        p = f"model.layers.{i}."
        shapes.update({p + "self_attn.q_proj.weight": (h, h), p + "self_attn.q_proj.bias": (h,),
                       p + "self_attn.k_proj.weight": (64, h), p + "self_attn.k_proj.bias": (64,),
                       p + "self_attn.v_proj.weight": (64, h), p + "self_attn.v_proj.bias": (64,),
                       p + "self_attn.o_proj.weight": (h, h), p + "mlp.gate_proj.weight": (f, h),
                       p + "mlp.up_proj.weight": (f, h), p + "mlp.down_proj.weight": (h, f),
                       p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,)})
    weights = {k: torch.randn(*s, generator=g) * 0.3 for k, s in shapes.items()}
    out.mkdir(parents=True)
    save_file(weights, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"], "torch_dtype": "float32",
                                                 "tie_word_embeddings": True}))
    (out / "tokenizer.json").write_text("{}")  # stands for the tokenizer files: copied as they are
    return weights


def test_the_twin_holds_what_a_version_zero_sync_sends(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    src = tmp_path / "model"
    weights = write_tiny(src)
    twin = fp8_checkpoint(src, "bfloat16", root=tmp_path)
    assert twin != src and fp8_checkpoint(src, "bfloat16", root=tmp_path) == twin  # written once
    config = json.loads((twin / "config.json").read_text())
    assert is_block_fp8(config) and config["torch_dtype"] == "bfloat16"
    assert {k: config["quantization_config"][k] for k in QUANTIZATION_CONFIG} == QUANTIZATION_CONFIG
    assert config["quantization_config"]["ignored_layers"] == []  # a dense model: every layer linear is fp8
    assert (twin / "tokenizer.json").read_text() == "{}"
    got = load_file(twin / "model.safetensors")
    sent = quantize_bucket({k: v.to(torch.bfloat16) for k, v in weights.items()})
    assert sorted(got) == sorted(sent)
    assert got["model.layers.1.mlp.down_proj.weight"].dtype == torch.float8_e4m3fn
    assert got["model.layers.1.mlp.down_proj.weight_scale_inv"].shape == (1, 2)
    for k, v in sent.items():
        assert got[k].dtype == v.dtype and torch.equal(got[k].view(torch.uint8), v.contiguous().view(torch.uint8)), k
    assert not list(tmp_path.glob("asyncrl-fp8-*.*"))  # no half-written copy left


def test_a_released_fp8_checkpoint_is_used_as_is_and_the_engine_is_told(tmp_path: Path) -> None:
    src = tmp_path / "released"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({"quantization_config": QUANTIZATION_CONFIG}))
    assert fp8_checkpoint(src, "bfloat16", root=tmp_path) == src.resolve()
    kwargs = engine_args(str(src), device="cuda", dtype="bfloat16", quantization="fp8")
    assert kwargs["quantization"] == "fp8" and kwargs["model"] == str(src)  # no file read: the rehearsal's too
    assert engine_args("<model_dir>", device="cuda", quantization="fp8")["quantization"] == "fp8"
    kwargs = fp8_model(kwargs)  # the backend's step: the model at the block-FP8 checkpoint
    assert kwargs["model"] == str(src.resolve()) and kwargs["tokenizer"] == str(src)
    plain = engine_args(str(src), device="cuda")
    assert "quantization" not in plain and fp8_model(plain) == plain
