"""Blockwise FP8 weights as DeepSeek-V3's released checkpoints store them: a matrix W (out × in) becomes

    q  = float8_e4m3fn( W / s_b )  elementwise, s_b the fp32 scale of W's 128 × 128 block b
    s_b = max(|W_b|) / 448         (448 = e4m3's largest finite value; an all-zero block gets s_b = 1)
    W  ≈ q · s                     s of shape ⌈out/128⌉ × ⌈in/128⌉ (the checkpoint's `weight_scale_inv`)

Edge blocks of a shape not divisible by 128 are the partial blocks (their amax is over the elements they have).
Rounding to e4m3 (3 mantissa bits) moves a normal value by at most half a unit in the last place, 2⁻⁴ of its
magnitude; below e4m3's smallest normal 2⁻⁶ (in units of s_b) the spacing is the subnormal step 2⁻⁹, so

    |W − q·s| ≤ 2⁻⁴·|W| + 2⁻¹⁰·s_b     for every element (round to nearest)

Which tensors (`quantizable`): what DeepSeek-V3's and Kimi-K2's released FP8 checkpoints store as fp8 — every 2-D
linear weight of the decoder layers (`…layers.N…`: attention and MLP projections, routed and shared experts);
the embeddings, the LM head, norms, biases and the MoE routers (`mlp.gate`, `shared_expert_gate`) stay in the
rollout dtype, and so does everything outside the decoder layers (a vision tower). Their config says so with
`quantization_config` = `QUANTIZATION_CONFIG` (vLLM's `Fp8Config`: `quant_method` "fp8", `weight_block_size`
[128, 128], dynamic activation scales).

The weight sync (`rollout.quantization = "fp8"`): the sender quantises each bucket as it leaves the trainer
(`quantize_bucket`; `engine.sync.runtime.publish`) — `X.weight` becomes the fp8 `X.weight` plus its fp32
`X.weight_scale_inv`, the names vLLM's fp8 loader takes for a block-quantised linear layer — so the bytes packed,
fingerprinted, moved and counted are the fp8 ones. The trainer keeps its bf16 / fp32 weights untouched.
`rollout.quantization = "fp8"` counts these bytes in the plan (`engine.plan.rollout_replica.FP8_BYTES`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

BLOCK = 128
E4M3_MAX = 448.0
"""torch.finfo(torch.float8_e4m3fn).max."""
NOT_QUANTIZED = ("embed_tokens", "lm_head", "norm", "gate.weight", "router", "bias")
"""Name fragments of the tensors that stay in the rollout dtype (HF names; the MoE router is `mlp.gate`, Qwen2-MoE's
shared-expert gate `shared_expert_gate`)."""
DECODER_LAYERS = ".layers."
"""The fragment every decoder layer's HF name has (`model.layers.N.…`, `model.language_model.layers.N.…`)."""
SCALE_SUFFIX = "weight_scale_inv"
"""The per-block scale's name beside `weight` (DeepSeek-V3's checkpoints; vLLM's block-fp8 parameter)."""
QUANTIZATION_CONFIG: dict[str, Any] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                       "weight_block_size": [BLOCK, BLOCK]}
"""`quantization_config` of DeepSeek-V3's and Kimi-K2's released config.json (what vLLM's `Fp8Config` reads)."""


def scale_shape(shape: tuple[int, int], block: int = BLOCK) -> tuple[int, int]:
    """⌈out/block⌉ × ⌈in/block⌉: one fp32 scale per block."""
    return -(-shape[0] // block), -(-shape[1] // block)


def _blocks(w: torch.Tensor, block: int) -> torch.Tensor:
    """W zero-padded to whole blocks, viewed as [rows of blocks, block, cols of blocks, block]."""
    r, c = scale_shape(tuple(w.shape), block)
    padded = torch.zeros(r * block, c * block, dtype=torch.float32, device=w.device)
    padded[: w.shape[0], : w.shape[1]] = w.float()
    return padded.view(r, block, c, block)


def quantize_blockwise(w: torch.Tensor, block: int = BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, s): W as float8 e4m3 and its fp32 block scales (module docstring). `w`: a 2-D float tensor."""
    if w.dim() != 2:
        raise ValueError(f"blockwise fp8 quantises matrices; got a tensor of shape {tuple(w.shape)}")
    blocks = _blocks(w, block)
    amax = blocks.abs().amax(dim=(1, 3))
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    q = (blocks / scale[:, None, :, None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    rows, cols = w.shape
    q = q.view(scale.shape[0] * block, scale.shape[1] * block)[:rows, :cols].contiguous()
    return q, scale.contiguous()


def dequantize_blockwise(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.bfloat16,
                         block: int = BLOCK) -> torch.Tensor:
    """q · s in `dtype`: each element times its block's scale."""
    full = scale.repeat_interleave(block, dim=0).repeat_interleave(block, dim=1)[: q.shape[0], : q.shape[1]]
    return (q.float() * full).to(dtype)


def quantizable(name: str, tensor: Any) -> bool:
    """Whether the HF tensor `name` is sent as fp8: a 2-D floating-point `….weight` of a decoder layer that is not
    a norm or a router (embeddings and the LM head lie outside the layers)."""
    floating = tensor.is_floating_point() if isinstance(tensor, torch.Tensor) else tensor.dtype.kind == "f"
    return (len(tensor.shape) == 2 and floating and name.endswith(".weight") and DECODER_LAYERS in name
            and not any(f in name for f in NOT_QUANTIZED))


def scale_name(name: str) -> str:
    """`X.weight` → `X.weight_scale_inv`."""
    return name.removesuffix("weight") + SCALE_SUFFIX


def quantize_bucket(bucket: dict[str, Any]) -> dict[str, Any]:
    """One bucket as it is sent with fp8 rollout weights: each `quantizable` `X.weight` replaced by its fp8 `X.weight`
    and fp32 `X.weight_scale_inv` (on the tensor's device), every other tensor as it was, in order."""
    out: dict[str, Any] = {}
    for name, t in bucket.items():
        if quantizable(name, t):
            out[name], out[scale_name(name)] = quantize_blockwise(torch.as_tensor(t))
        else:
            out[name] = t
    return out


def quantized(buckets: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """`quantize_bucket` over a sync's buckets, one at a time (as the trainer exports them)."""
    for bucket in buckets:
        yield quantize_bucket(bucket)


def dequantize_bucket(bucket: dict[str, Any], dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
    """The inverse the receiver's fp8 layer computes (q · s per block): fp8 weights with their scales back in `dtype`
    under their own names, the scales dropped, every other tensor as it was."""
    out: dict[str, torch.Tensor] = {}
    for name, t in bucket.items():
        if name.endswith(SCALE_SUFFIX):
            continue
        t = torch.as_tensor(t)
        scale = bucket.get(scale_name(name)) if name.endswith(".weight") else None
        out[name] = dequantize_blockwise(t, torch.as_tensor(scale), dtype) if scale is not None else t
    return out


def quantized_bytes(shape: tuple[int, int], block: int = BLOCK) -> int:
    """Bytes of one quantised matrix: out·in fp8 bytes plus 4 per block scale."""
    r, c = scale_shape(shape, block)
    return shape[0] * shape[1] + 4 * r * c
