"""The memory model with packed rows (`trainer.use_remove_padding`): T counts packed (real) tokens on the torch /
FSDP2 trainer and padded ones where rows are padded (Megatron, rows with images), with the same bound — the
trainer's token budget bounds the tokens its packed forward computes on (tests/trainer/test_packed_rows.py)."""

from __future__ import annotations

from pathlib import Path

from asyncrl_cli.config.loader import analyze_run_config
from engine.plan.memory import predict_memory

RUNS = Path(__file__).resolve().parents[2] / "presets" / "runs"


def _trainer(name: str, *overrides: str):
    an = analyze_run_config(RUNS / f"{name}.toml", list(overrides))
    assert an.config is not None and an.model is not None and an.hardware is not None
    return predict_memory(an.config, an.model, trainer_world=an.derived.trainer_world,
                          memory_gb=an.hardware.memory_gb, device=an.hardware.device).trainer


def test_packed_rows_count_real_tokens_under_the_same_bound() -> None:
    on = _trainer("qwen2.5-math-7b-dapo-fsdp2-64-64")
    off = _trainer("qwen2.5-math-7b-dapo-fsdp2-64-64", "trainer.use_remove_padding=false")
    assert (on.details["token_count"], off.details["token_count"]) == ("packed", "padded")
    assert on.terms == off.terms  # the budget bounds the packed tokens as it bounded the padded ones
    assert _trainer("qwen3-30b-a3b-base-dapo-megatron-96-32").details["token_count"] == "padded"
    assert _trainer("qwen3-vl-8b-geo3k-fsdp2-npu-2x8").details["token_count"] == "padded"  # rows with images
