"""The image path on CUDA: sampler and trainer agree with images (fp32), and bf16 sampling with images runs."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.models.loader import load_causal_lm
from engine.rollout.base import SamplingParams
from engine.rollout.hf.backend import HFRolloutBackend
from engine.trainer.batch import collate
from engine.trainer.torch_trainer import TorchTrainerBackend
from engine.types import GenRequest, Trajectory

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _requests(vl_tokenizer: Any, n: int = 3) -> list[GenRequest]:
    from engine.data.prompts import load_prompts

    prompts, _ = load_prompts({"train_files": ["builtin:figures"], "train_size": 4}, vl_tokenizer)
    return [GenRequest(f"{p.uid}#{j}", p.prompt_ids, max_new_tokens=12, images=p.images) for p in prompts for j in range(n)]


def test_cuda_sampler_and_trainer_agree_with_images(vl_dir: Path, vl_tokenizer: Any) -> None:
    model = load_causal_lm(vl_dir)
    sampler = HFRolloutBackend(copy.deepcopy(model), eos_token_id=vl_tokenizer.eos_token_id,
                               pad_token_id=vl_tokenizer.pad_token_id, device="cuda")
    trainer = TorchTrainerBackend(model, optim_cfg={"lr": 1e-3}, micro_batch_size=4, device="cuda")
    reqs = _requests(vl_tokenizer)
    polls = iter(range(10_000))
    first = sampler.generate(reqs, SamplingParams(seed=1), should_abort=lambda: next(polls) >= 4)
    resumed = [GenRequest(r.request_id, q.prompt_ids, r.response_ids, r.log_probs, 12 - len(r.response_ids),
                          min_version=0, images=q.images) if r.finish_reason == "abort" else None
               for q, r in zip(reqs, first)]
    again = sampler.generate([x for x in resumed if x is not None], SamplingParams(seed=2))
    by_id = {r.request_id: r for r in again}
    final = [by_id.get(r.request_id, r) for r in first]
    rows = [(q.prompt_ids, Trajectory(r.response_ids, r.log_probs, r.finish_reason, 0, 0), q.images)
            for q, r in zip(reqs, final)]
    batch = collate(rows, vl_tokenizer.pad_token_id)
    log_probs, _ = trainer.compute_log_probs(batch)
    mask = batch.response_mask.bool()
    assert float((log_probs - batch.rollout_log_probs)[mask].abs().max()) < 1e-4


def test_cuda_bf16_sampling_with_images(vl_dir: Path, vl_tokenizer: Any) -> None:
    sampler = HFRolloutBackend(load_causal_lm(vl_dir), eos_token_id=vl_tokenizer.eos_token_id,
                               pad_token_id=vl_tokenizer.pad_token_id, device="cuda", dtype=torch.bfloat16)
    results = sampler.generate(_requests(vl_tokenizer, n=4), SamplingParams(temperature=1.0, top_p=0.9, seed=0))
    assert all(len(r.response_ids) == len(r.log_probs) > 0 for r in results)
    assert all(math.isfinite(lp) and lp <= 0 for r in results for lp in r.log_probs)
