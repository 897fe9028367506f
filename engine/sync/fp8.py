"""Blockwise FP8 weights as DeepSeek-V3's released checkpoints store them: a matrix W (out × in) becomes

    q  = float8_e4m3fn( W / s_b )  elementwise, s_b the fp32 scale of W's 128 × 128 block b
    s_b = max(|W_b|) / 448         (448 = e4m3's largest finite value; an all-zero block gets s_b = 1)
    W  ≈ q · s                     s of shape ⌈out/128⌉ × ⌈in/128⌉ (the checkpoint's `weight_scale_inv`)

Edge blocks of a shape not divisible by 128 are the partial blocks (their amax is over the elements they have).
Rounding to e4m3 (3 mantissa bits) moves a normal value by at most half a unit in the last place, 2⁻⁴ of its
magnitude; below e4m3's smallest normal 2⁻⁶ (in units of s_b) the spacing is the subnormal step 2⁻⁹, so

    |W − q·s| ≤ 2⁻⁴·|W| + 2⁻¹⁰·s_b     for every element (round to nearest)

Which tensors: the 2-D linear weights (attention and MLP projections, experts); embeddings, the LM head, norms,
biases and routers stay in the rollout dtype (`quantizable`). Pure torch; `rollout.quantization = "fp8"` counts
its bytes (`engine.plan.rollout_replica.FP8_BYTES`). The weight-sync export does not call it yet: the replicas'
fp8 loading (vLLM's `Fp8LinearMethod` over a bf16 checkpoint) is the runtime's part of issue 45.
"""

from __future__ import annotations

import torch

BLOCK = 128
E4M3_MAX = 448.0
"""torch.finfo(torch.float8_e4m3fn).max."""
NOT_QUANTIZED = ("embed_tokens", "lm_head", "norm", "gate.weight", "router", "bias")
"""Name fragments of the tensors that stay in the rollout dtype (HF names; the MoE router is `mlp.gate`)."""


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


def quantizable(name: str, tensor: torch.Tensor) -> bool:
    """Whether the HF tensor `name` is sent as fp8: a 2-D weight that is not an embedding, head, norm or router."""
    return tensor.dim() == 2 and tensor.is_floating_point() and not any(f in name for f in NOT_QUANTIZED)


def quantized_bytes(shape: tuple[int, int], block: int = BLOCK) -> int:
    """Bytes of one quantised matrix: out·in fp8 bytes plus 4 per block scale."""
    r, c = scale_shape(shape, block)
    return shape[0] * shape[1] + 4 * r * c
