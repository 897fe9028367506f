"""The `hf` sampler on CUDA: greedy equals transformers' generate, resume equality, trainer agreement, bf16."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from engine.rollout.base import SamplingParams
from engine.rollout.hf.backend import HFRolloutBackend
from engine.trainer.batch import collate
from engine.trainer.torch_trainer import TorchTrainerBackend
from engine.types import GenRequest, Trajectory

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
PAD, EOS = 0, 1


def reqs(n: int = 3, budget: int = 12) -> list[GenRequest]:
    gen = torch.Generator().manual_seed(0)
    ps = [torch.randint(2, 32, (3 + i,), generator=gen).tolist() for i in range(5)]
    return [GenRequest(f"{i}/{j}", p, max_new_tokens=budget) for i, p in enumerate(ps) for j in range(n)]


def test_cuda_greedy_matches_generate_and_resume(tiny_lm) -> None:
    model = tiny_lm().cuda()
    backend = HFRolloutBackend(model, eos_token_id=EOS, pad_token_id=PAD, device="cuda")
    requests = reqs(n=1)
    full = backend.generate(requests, SamplingParams(temperature=0.0))
    for r, res in zip(requests, full):
        with torch.no_grad():
            ref = model.generate(torch.tensor([r.prompt_ids], device="cuda"), max_new_tokens=12, do_sample=False,
                                 eos_token_id=EOS, pad_token_id=PAD)[0, len(r.prompt_ids):].tolist()
        assert res.response_ids == (ref[: ref.index(EOS) + 1] if EOS in ref else ref)
    calls = iter(range(100))
    partial = backend.generate(requests, SamplingParams(temperature=0.0), should_abort=lambda: next(calls) >= 4)
    todo = [GenRequest(r.request_id, r.prompt_ids, p.response_ids, p.log_probs, 12 - len(p.response_ids))
            for r, p in zip(requests, partial) if p.finish_reason == "abort"]
    assert todo
    resumed = {x.request_id: x for x in backend.generate(todo, SamplingParams(temperature=0.0))}
    for p, f in zip(partial, full):
        final = resumed.get(p.request_id, p)
        assert final.response_ids == f.response_ids
        assert final.log_probs == pytest.approx(f.log_probs, abs=1e-5)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_cuda_sampler_log_probs_equal_trainer(tiny_lm, temperature: float) -> None:
    model = tiny_lm()
    backend = HFRolloutBackend(copy.deepcopy(model), eos_token_id=EOS, pad_token_id=PAD, device="cuda")
    trainer = TorchTrainerBackend(model, optim_cfg={"lr": 1e-3}, temperature=temperature, device="cuda")
    requests = reqs()
    results = backend.generate(requests, SamplingParams(temperature=temperature, seed=1))
    rows = [(r.prompt_ids, Trajectory(x.response_ids, x.log_probs, x.finish_reason, 0, 0)) for r, x in zip(requests, results)]
    batch = collate(rows, pad_token_id=PAD)
    log_probs, _ = trainer.compute_log_probs(batch)
    mask = batch.response_mask.bool()
    assert float((log_probs - batch.rollout_log_probs)[mask].abs().max()) < 1e-4


def test_cuda_bf16_sampling_runs_and_updates_weights(tiny_lm) -> None:
    backend = HFRolloutBackend(tiny_lm(), eos_token_id=EOS, pad_token_id=PAD, device="cuda", dtype=torch.bfloat16)
    results = backend.generate(reqs(n=4), SamplingParams(temperature=1.0, top_p=0.9, top_k=20, seed=0))
    assert all(len(r.response_ids) == len(r.log_probs) > 0 for r in results)
    assert all(math.isfinite(lp) and lp <= 0 for r in results for lp in r.log_probs)
    trainer = TorchTrainerBackend(tiny_lm(seed=5), optim_cfg={"lr": 1e-3})
    backend.update_weights(trainer.export_weights(1 << 16), version=1)
    assert backend.model.lm_head.weight.dtype == torch.bfloat16
    expected = trainer.model.lm_head.weight.to(torch.bfloat16).cuda()
    assert torch.equal(backend.model.lm_head.weight, expected)
