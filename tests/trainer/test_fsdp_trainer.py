"""FSDP2 over gloo with 2 processes: same gradient step as one process, losses fall on both ranks, full
state dict export on rank 0, checkpoints readable by the single-process trainer."""

from __future__ import annotations

from itertools import pairwise

import pytest
import torch
from fsdp_worker import MICRO, OPTIM, ROWS, run_rank
from trainer_helpers import build_tiny_lm, random_batch, spawn_ranks, token_mean_pg_loss

from engine.trainer.torch_trainer import TorchTrainerBackend

WORLD = 2


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_two_rank_fsdp_matches_single_process(tmp_path) -> None:
    ranks = spawn_ranks(run_rank, WORLD, tmp_path)

    single = TorchTrainerBackend(build_tiny_lm(seed=0), optim_cfg=OPTIM, grad_clip=1e6, micro_batch_size=MICRO)
    reference = single.train_step(random_batch(rows=ROWS, seed=0), token_mean_pg_loss)
    expected = single.model.state_dict()

    exported = ranks[0]["export"]
    assert ranks[1]["export"] == {} and ranks[1]["final"] == {}
    assert set(exported) == set(expected) and "lm_head.weight" in exported
    for name, tensor in expected.items():
        torch.testing.assert_close(exported[name], tensor, atol=1e-5, rtol=0)
    for r in ranks:
        assert r["tied"]
        assert abs(r["metrics_step1"]["actor/grad_norm"] - reference["actor/grad_norm"]) < 1e-5
        assert abs(r["metrics_step1"]["actor/pg_loss"] - reference["actor/pg_loss"]) < 1e-5
        assert r["prox_max_diff"] < 1e-6
        losses = r["losses"]
        assert losses[-1] < losses[0] - 0.05 and all(b < a for a, b in pairwise(losses))

    restored = TorchTrainerBackend(build_tiny_lm(seed=9), optim_cfg=OPTIM, micro_batch_size=MICRO)
    restored.load(str(tmp_path / "ckpt"))
    assert restored.global_step == 7
    for name, tensor in restored.model.state_dict().items():
        assert torch.equal(tensor, ranks[0]["final"][name]), name
