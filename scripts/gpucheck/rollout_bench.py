"""Generation throughput of the project's `hf` rollout backend (`engine.rollout.hf.backend.HFRolloutBackend`).

tokens/s = Σ new tokens / wall seconds of one `generate` call over `prompts × n` requests (sampling at
T = 1, log-probs of every sampled token included), after a short warm-up call.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from engine.rollout.base import SamplingParams
from engine.rollout.hf.backend import HFRolloutBackend
from engine.types import GenResult
from gpucheck.batches import random_prompts, requests_for
from gpucheck.models import ModelSpec
from gpucheck.report import cuda_sync, peak_gib_and_reset


def hf_generation(
    model: torch.nn.Module,
    spec: ModelSpec,
    device: str,
    *,
    prompts: int,
    n: int,
    prompt_len: int,
    new_tokens: int,
    seed: int,
) -> tuple[dict[str, Any], list[list[int]], list[GenResult]]:
    """Measure one batched generation; returns (metrics, prompts, results) so a trainer can reuse them."""
    backend = HFRolloutBackend(
        model, eos_token_id=spec.eos_id, pad_token_id=spec.eos_id, max_batch_size=prompts * n, device=device
    )
    prompt_ids = random_prompts(prompts, prompt_len, spec.vocab_size, {spec.eos_id}, seed)
    backend.generate(requests_for(prompt_ids[:1], n, 4, "warm"), SamplingParams(temperature=1.0, seed=seed))
    cuda_sync()
    peak_gib_and_reset()
    requests = requests_for(prompt_ids, n, new_tokens, "bench")
    start = time.perf_counter()
    results = backend.generate(requests, SamplingParams(temperature=1.0, seed=seed))
    cuda_sync()
    seconds = time.perf_counter() - start
    generated = sum(r.new_tokens for r in results)
    stats = backend.stats()
    metrics = {
        "requests": len(requests),
        "prompt_len": prompt_len,
        "max_new_tokens": new_tokens,
        "generated_tokens": generated,
        "seconds": round(seconds, 3),
        "tokens_per_s": round(generated / seconds, 1),
        "decode_steps": int(stats["decode_steps"]),
        "finished_stop": int(sum(r.finish_reason == "stop" for r in results)),
        "peak_gpu_gib": peak_gib_and_reset(),
    }
    return metrics, prompt_ids, results
