"""Precision per role: a bf16 `hf` replica against an fp32 trainer (`rollout.dtype = "bf16"`).

The replica's parameters are bf16, the trainer's fp32; log-probs of the sampled tokens agree only loosely
(the train–inference mismatch rollout correction is for), and weights synced from the fp32 trainer are cast
to bf16 on load.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

from engine.rollout.base import SamplingParams
from engine.rollout.hf.backend import HFRolloutBackend
from engine.plan.role_parts import rollout_dtype
from engine.trainer.batch import collate
from engine.trainer.torch_trainer import TorchTrainerBackend
from engine.types import GenRequest, Trajectory

PAD, EOS = 0, 1


def _requests() -> list[GenRequest]:
    gen = torch.Generator().manual_seed(3)
    ps = [torch.randint(2, 32, (int(torch.randint(3, 9, (1,), generator=gen)),), generator=gen).tolist()
          for _ in range(6)]
    return [GenRequest(f"{i}/{j}", p, max_new_tokens=12) for i, p in enumerate(ps) for j in range(4)]


def test_bf16_replica_generates_with_log_probs_close_to_the_fp32_trainer(tiny_lm) -> None:
    model = tiny_lm()
    backend = HFRolloutBackend(copy.deepcopy(model), eos_token_id=EOS, pad_token_id=PAD, dtype="bfloat16")
    assert all(p.dtype == torch.bfloat16 for p in backend.model.parameters())
    reqs = _requests()
    results = backend.generate(reqs, SamplingParams(temperature=1.0, seed=5))
    assert all(r.response_ids and len(r.log_probs) == len(r.response_ids) for r in results)
    assert any(r.finish_reason == "stop" for r in results) and any(r.finish_reason == "length" for r in results)
    assert all(lp <= 0.0 for r in results for lp in r.log_probs)

    trainer = TorchTrainerBackend(model, optim_cfg={"lr": 1e-3}, micro_batch_size=8, temperature=1.0)
    rows = [(q.prompt_ids, Trajectory(r.response_ids, r.log_probs, r.finish_reason, r.min_version, r.max_version))
            for q, r in zip(reqs, results)]
    batch = collate(rows, pad_token_id=PAD)
    fp32_log_probs, _ = trainer.compute_log_probs(batch)
    mask = batch.response_mask.bool()
    diff = (fp32_log_probs - batch.rollout_log_probs)[mask].abs()
    assert float(diff.mean()) < 0.05 and float(diff.max()) < 0.5, (float(diff.mean()), float(diff.max()))
    assert float(diff.max()) > 0.0  # really another precision: not bit-equal to fp32


def test_weights_from_an_fp32_trainer_are_cast_to_bf16_on_load(tiny_lm) -> None:
    source = tiny_lm(seed=1)
    trainer = TorchTrainerBackend(copy.deepcopy(source), optim_cfg={"lr": 1e-3})
    backend = HFRolloutBackend(tiny_lm(seed=2), eos_token_id=EOS, pad_token_id=PAD, dtype=torch.bfloat16)
    backend.update_weights(list(trainer.export_weights(bucket_bytes=64 * 1024)), version=3)
    for name, p in backend.model.state_dict().items():
        assert p.dtype == torch.bfloat16, name
        assert torch.equal(p, source.state_dict()[name].to(torch.bfloat16)), name
    out = backend.generate([GenRequest("a", [2, 7, 9], max_new_tokens=6)], SamplingParams(temperature=0.0))
    assert out[0].max_version == 3 and len(out[0].response_ids) >= 1


@pytest.mark.parametrize("rollout, model, expected", [
    (None, "float32", "float32"), ("bf16", "float32", "bfloat16"), ("fp32", "bfloat16", "float32"),
    (None, "bfloat16", "bfloat16"),
])
def test_rollout_dtype_is_set_apart_from_the_trainer(rollout, model, expected) -> None:
    cfg = SimpleNamespace(rollout=SimpleNamespace(dtype=rollout), model=SimpleNamespace(dtype=model))
    assert rollout_dtype(cfg) == expected
