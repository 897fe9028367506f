"""The sampler and the trainer agree: same log-probs for the same tokens (fp32), and weights exported by
the trainer make the sampler behave exactly like a fresh model holding those weights."""

from __future__ import annotations

import copy

import pytest
import torch

from engine.rollout.base import SamplingParams
from engine.rollout.hf.backend import HFRolloutBackend
from engine.trainer.batch import collate
from engine.trainer.torch_trainer import TorchTrainerBackend
from engine.types import GenRequest, Trajectory

PAD, EOS = 0, 1


def sample_rows(backend: HFRolloutBackend, temperature: float) -> list[tuple[list[int], Trajectory]]:
    gen = torch.Generator().manual_seed(11)
    ps = [torch.randint(2, 32, (int(torch.randint(3, 9, (1,), generator=gen)),), generator=gen).tolist() for _ in range(6)]
    reqs = [GenRequest(f"{i}/{j}", p, max_new_tokens=10) for i, p in enumerate(ps) for j in range(3)]
    results = backend.generate(reqs, SamplingParams(temperature=temperature, top_k=0, top_p=1.0, seed=4))
    return [(reqs[i].prompt_ids, Trajectory(r.response_ids, r.log_probs, r.finish_reason, r.min_version, r.max_version))
            for i, r in enumerate(results)]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampler_log_probs_equal_trainer_log_probs(tiny_lm, temperature: float) -> None:
    model = tiny_lm()
    backend = HFRolloutBackend(copy.deepcopy(model), eos_token_id=EOS, pad_token_id=PAD)
    trainer = TorchTrainerBackend(model, optim_cfg={"lr": 1e-3}, micro_batch_size=4, temperature=temperature)
    rows = sample_rows(backend, temperature)
    assert any(t.finish_reason == "stop" for _, t in rows)
    batch = collate(rows, pad_token_id=PAD)
    log_probs, entropy = trainer.compute_log_probs(batch, with_entropy=True)
    mask = batch.response_mask.bool()
    diff = (log_probs - batch.rollout_log_probs)[mask].abs().max()
    assert float(diff) < 1e-4
    assert entropy is not None and bool((entropy[mask] > 0).all())
    assert bool((log_probs[~mask] == 0).all())


def test_update_weights_from_trainer_export_matches_fresh_model(tiny_lm) -> None:
    source = tiny_lm(seed=1)
    trainer = TorchTrainerBackend(copy.deepcopy(source), optim_cfg={"lr": 1e-3})
    backend = HFRolloutBackend(tiny_lm(seed=2), eos_token_id=EOS, pad_token_id=PAD)
    fresh = HFRolloutBackend(copy.deepcopy(source), eos_token_id=EOS, pad_token_id=PAD)
    reqs = [GenRequest(str(i), [2 + i, 7, 9 + i], max_new_tokens=12) for i in range(5)]
    greedy = SamplingParams(temperature=0.0)
    before = backend.generate(reqs, greedy)
    buckets = list(trainer.export_weights(bucket_bytes=64 * 1024))
    assert len(buckets) > 1 and any("lm_head.weight" in b for b in buckets)
    backend.update_weights(buckets, version=5)
    after = backend.generate(reqs, greedy)
    expected = fresh.generate(reqs, greedy)
    assert [r.response_ids for r in after] == [r.response_ids for r in expected]
    assert [r.response_ids for r in after] != [r.response_ids for r in before]
    for a, e in zip(after, expected):
        assert a.log_probs == pytest.approx(e.log_probs, abs=1e-6)
        assert (a.min_version, a.max_version) == (5, 5)
    stats = backend.stats()
    assert stats["weight_updates"] == 1 and stats["version"] == 5
    assert stats["weight_update_bytes"] == sum(a.nbytes for b in buckets for a in b.values())
