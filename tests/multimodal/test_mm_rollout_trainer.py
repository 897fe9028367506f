"""The `hf` sampler and the torch trainer with images: same log-probs for the same tokens (fp32, fresh and
resumed prefixes), image inputs that matter, placeholder checks, and training that reaches the vision tower."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.algo.rc_diagnostics import offpolicy_metrics
from engine.models.loader import load_causal_lm
from engine.multimodal.placeholders import PlaceholderMismatch
from engine.rollout.base import SamplingParams
from engine.rollout.hf.backend import HFRolloutBackend
from engine.trainer.batch import collate
from engine.trainer.torch_trainer import TorchTrainerBackend
from engine.types import GenRequest, Prompt, Trajectory, TrajectoryGroup


@pytest.fixture(scope="module")
def prompts(vl_tokenizer: Any) -> list[Prompt]:
    from engine.data.prompts import load_prompts

    ps, _ = load_prompts({"train_files": ["builtin:figures"], "train_size": 4, "seed": 1}, vl_tokenizer)
    return ps


def _backends(vl_dir: Path, vl_tokenizer: Any, temperature: float = 1.0) -> tuple[HFRolloutBackend, TorchTrainerBackend]:
    model = load_causal_lm(vl_dir)
    sampler = HFRolloutBackend(copy.deepcopy(model), eos_token_id=vl_tokenizer.eos_token_id,
                               pad_token_id=vl_tokenizer.pad_token_id, max_batch_size=6)
    trainer = TorchTrainerBackend(model, optim_cfg={"lr": 1e-2}, micro_batch_size=3, temperature=temperature)
    return sampler, trainer


def _groups(prompts: list[Prompt], results: list[Any], n: int) -> list[TrajectoryGroup]:
    return [TrajectoryGroup(p, [Trajectory(r.response_ids, r.log_probs, r.finish_reason, r.min_version,
                                           r.max_version, reward=float(j % 2)) for j, r in enumerate(results[n * i:n * i + n])])
            for i, p in enumerate(prompts)]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampler_and_trainer_agree_with_images(vl_dir: Path, vl_tokenizer: Any, prompts: list[Prompt],
                                                temperature: float) -> None:
    sampler, trainer = _backends(vl_dir, vl_tokenizer, temperature)
    reqs = [GenRequest(f"{p.uid}#{j}", p.prompt_ids, max_new_tokens=10, images=p.images) for p in prompts for j in range(3)]
    results = sampler.generate(reqs, SamplingParams(temperature=temperature, seed=2))
    image_id = sampler.vision.image_token_id
    assert all(image_id not in r.response_ids for r in results)  # placeholders are never sampled
    batch = collate(_groups(prompts, results, 3), vl_tokenizer.pad_token_id)
    assert [len(x) for x in batch.meta["images"]] == [1] * 12
    log_probs, entropy = trainer.compute_log_probs(batch, with_entropy=True)
    mask = batch.response_mask.bool()
    assert float((log_probs - batch.rollout_log_probs)[mask].abs().max()) < 1e-4
    kl = offpolicy_metrics(log_probs, batch.rollout_log_probs, batch.response_mask)["kl"]
    assert abs(float(kl)) < 1e-4
    assert entropy is not None and bool(torch.isfinite(entropy[mask]).all())
    assert sampler.stats()["images"] == 12


def test_resumed_prefix_keeps_its_images(vl_dir: Path, vl_tokenizer: Any, prompts: list[Prompt]) -> None:
    sampler, trainer = _backends(vl_dir, vl_tokenizer)
    reqs = [GenRequest(f"{p.uid}#0", p.prompt_ids, max_new_tokens=12, images=p.images) for p in prompts]
    polls = iter(range(1000))
    first = sampler.generate(reqs, SamplingParams(temperature=1.0, seed=3), should_abort=lambda: next(polls) >= 5)
    aborted = [(q, r) for q, r in zip(reqs, first) if r.finish_reason == "abort"]
    assert len(aborted) >= 2 and all(0 < len(r.response_ids) < 12 for _, r in aborted)
    resumed = [GenRequest(r.request_id, q.prompt_ids, prefix_ids=r.response_ids, prefix_log_probs=r.log_probs,
                          max_new_tokens=12 - len(r.response_ids), min_version=0, images=q.images)
               for q, r in aborted]
    final = sampler.generate(resumed, SamplingParams(temperature=1.0, seed=4))
    assert all(len(r.response_ids) == 12 or r.finish_reason == "stop" for r in final)
    rows = [(q.prompt_ids, Trajectory(r.response_ids, r.log_probs, r.finish_reason, 0, 0), q.images)
            for (q, _), r in zip(aborted, final)]
    batch = collate(rows, vl_tokenizer.pad_token_id)
    log_probs, _ = trainer.compute_log_probs(batch)
    assert float((log_probs - batch.rollout_log_probs)[batch.response_mask.bool()].abs().max()) < 1e-4


def test_the_image_changes_the_policy(vl_dir: Path, vl_tokenizer: Any, prompts: list[Prompt],
                                      figure_images: list[str]) -> None:
    sampler, _ = _backends(vl_dir, vl_tokenizer)
    p = prompts[0]
    # same tokens, two different figures of the same size: two prefills, two different distributions
    reqs = [GenRequest("a", p.prompt_ids, max_new_tokens=4, images=[figure_images[0]]),
            GenRequest("b", p.prompt_ids, max_new_tokens=4, images=[figure_images[2]])]
    a, b = sampler.generate(reqs, SamplingParams(temperature=0.0))
    assert a.log_probs[0] != pytest.approx(b.log_probs[0], abs=1e-6)


def test_placeholder_mismatch_and_text_model_requests_are_refused(vl_dir: Path, vl_tokenizer: Any,
                                                                  prompts: list[Prompt], tiny_text_lm: Any) -> None:
    sampler, _ = _backends(vl_dir, vl_tokenizer)
    p = prompts[0]
    with pytest.raises(PlaceholderMismatch, match=r"request 'x': placeholders do not match the images"):
        sampler.generate([GenRequest("x", p.prompt_ids, max_new_tokens=2)], SamplingParams())
    with pytest.raises(PlaceholderMismatch, match=r"image-token runs \[9\] but 2 image\(s\)"):
        sampler.generate([GenRequest("x", p.prompt_ids, max_new_tokens=2, images=p.images * 2)], SamplingParams())
    assert sampler.stats()["image_mismatch"] == 2
    text = HFRolloutBackend(tiny_text_lm, eos_token_id=1, pad_token_id=0)
    with pytest.raises(ValueError, match="has 1 image\\(s\\) but the model is text-only"):
        text.generate([GenRequest("t", [3, 4], max_new_tokens=2, images=p.images)], SamplingParams())


def test_train_step_updates_vision_tower_and_syncs_to_sampler(vl_dir: Path, vl_tokenizer: Any,
                                                              prompts: list[Prompt]) -> None:
    sampler, trainer = _backends(vl_dir, vl_tokenizer)
    reqs = [GenRequest(f"{p.uid}#{j}", p.prompt_ids, max_new_tokens=6, images=p.images) for p in prompts for j in range(2)]
    batch = collate(_groups(prompts, sampler.generate(reqs, SamplingParams(seed=5)), 2), vl_tokenizer.pad_token_id)
    batch.advantages = (batch.meta["rewards"] - 0.5)[:, None] * batch.response_mask
    vision_before = trainer.model.model.visual.blocks[0].attn.qkv.weight.detach().clone()

    def loss_fn(log_probs: torch.Tensor, entropy: Any, micro: Any) -> tuple[torch.Tensor, dict[str, float]]:
        mask = micro.response_mask
        return -(log_probs * micro.advantages * mask).sum() / mask.sum().clamp(min=1), {}

    metrics = trainer.train_step(batch, loss_fn)
    assert metrics["actor/skipped_step"] == 0 and metrics["actor/grad_norm"] > 0
    assert not torch.equal(vision_before, trainer.model.model.visual.blocks[0].attn.qkv.weight)
    sampler.update_weights(trainer.export_weights(bucket_bytes=1 << 20), version=1)
    results = sampler.generate(reqs, SamplingParams(seed=6))
    batch = collate(_groups(prompts, results, 2), vl_tokenizer.pad_token_id)
    log_probs, _ = trainer.compute_log_probs(batch)
    assert float((log_probs - batch.rollout_log_probs)[batch.response_mask.bool()].abs().max()) < 1e-4
    assert all(r.max_version == 1 for r in results)
