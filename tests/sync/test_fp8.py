"""Blockwise FP8 (`engine.sync.fp8`, DeepSeek-V3's 128 × 128 layout): the round trip stays within e4m3's error
bound, the scales have one fp32 per block (partial blocks at ragged edges), and the byte count the planner uses
(`engine.plan.rollout_replica.FP8_BYTES`) is what the quantiser produces."""

from __future__ import annotations

import pytest
import torch

from engine.plan.rollout_replica import FP8_BYTES
from engine.sync.fp8 import (E4M3_MAX, dequantize_blockwise, quantizable, quantize_blockwise, quantized_bytes,
                             scale_shape)


@pytest.mark.parametrize("shape", [(256, 384), (300, 200), (1, 129), (128, 1)])
def test_round_trip_within_the_e4m3_bound(shape: tuple[int, int]) -> None:
    g = torch.Generator().manual_seed(0)
    # rows of very different magnitudes, so blocks get different scales and small values go subnormal
    w = torch.randn(*shape, generator=g) * torch.logspace(-4, 1, shape[0])[:, None]
    q, s = quantize_blockwise(w)
    assert q.dtype == torch.float8_e4m3fn and q.shape == w.shape
    assert s.dtype == torch.float32 and tuple(s.shape) == scale_shape(shape)
    back = dequantize_blockwise(q, s, torch.float32)
    per_elem = s.repeat_interleave(128, 0).repeat_interleave(128, 1)[: shape[0], : shape[1]]
    bound = 2**-4 * w.abs() + 2**-10 * per_elem
    assert ((w - back).abs() <= bound + 1e-12).all()
    assert (w - back).abs().max() > 0  # it is lossy: the bound is not vacuous


def test_scales_are_each_blocks_amax_over_448_ragged_edges_included() -> None:
    w = torch.zeros(300, 200)
    w[0, 0], w[299, 199], w[130, 5] = 3.0, -896.0, 0.5  # blocks (0, 0), (2, 1), (1, 0)
    q, s = quantize_blockwise(w)
    assert s.shape == (3, 2)
    assert s[0, 0] == pytest.approx(3.0 / E4M3_MAX) and s[2, 1] == pytest.approx(2.0) and s[1, 0] == pytest.approx(
        0.5 / E4M3_MAX)
    assert s[0, 1] == 1.0  # an all-zero block
    # the block's largest element lands on ±448 exactly, so it comes back exactly
    assert dequantize_blockwise(q, s, torch.float32)[299, 199] == -896.0
    assert q.float()[299, 199] == -E4M3_MAX


def test_weights_keep_their_sign_and_zero_stays_zero() -> None:
    w = torch.tensor([[0.0, -1e-3, 1e-3, 5.0]])
    back = dequantize_blockwise(*quantize_blockwise(w), torch.float32)
    assert back[0, 0] == 0 and back[0, 1] < 0 < back[0, 2] and back[0, 3] == 5.0


def test_what_is_quantised_and_its_bytes() -> None:
    m = torch.empty(4096, 7168)
    assert quantizable("model.layers.3.mlp.experts.7.down_proj.weight", m)
    assert quantizable("model.layers.0.self_attn.q_proj.weight", m)
    for name in ("model.embed_tokens.weight", "lm_head.weight", "model.layers.3.mlp.gate.weight",
                 "model.layers.0.input_layernorm.weight"):
        assert not quantizable(name, m), name
    assert not quantizable("model.layers.0.self_attn.q_proj.bias", torch.empty(4096))
    # whole blocks: exactly the planner's 1 + 4/128² bytes per weight
    assert quantized_bytes((4096, 7168)) == pytest.approx(4096 * 7168 * FP8_BYTES)
    assert quantized_bytes((300, 200)) == 300 * 200 + 4 * 6


def test_a_vector_is_refused() -> None:
    with pytest.raises(ValueError, match="matrices"):
        quantize_blockwise(torch.ones(10))
