"""FSDP2 over 2 gloo ranks takes verl's mini-batch steps: each rank splits its rows, rank r's mini-batch k is its
share of the global mini-batch k (as verl's DP actors split their own shards)."""

from __future__ import annotations

import pytest
import torch
from fsdp_minibatch_worker import run_rank
from fsdp_worker import MICRO, OPTIM, ROWS
from trainer_helpers import build_tiny_lm, random_batch, spawn_ranks, token_mean_pg_loss

from engine.trainer.torch_trainer import TorchTrainerBackend


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_two_ranks_two_mini_batches_two_epochs_equal_four_single_process_updates(tmp_path) -> None:
    ranks = spawn_ranks(run_rank, 2, tmp_path)
    batch = random_batch(rows=ROWS, seed=0)
    single = TorchTrainerBackend(build_tiny_lm(seed=0), optim_cfg=OPTIM, grad_clip=1e6, micro_batch_size=MICRO)
    # rank 0 holds rows 0-3, rank 1 rows 4-7; global mini-batches {0,1,4,5} and {2,3,6,7}, twice
    for rows in ([0, 1, 4, 5], [2, 3, 6, 7]) * 2:
        single.train_step(batch.select(torch.tensor(rows)), token_mean_pg_loss)
    assert single.global_step == 4
    for r in ranks:
        assert r["steps"] == 4 and r["metrics"]["asyncrl/trainer/optimizer_steps"] == 4
    exported = ranks[0]["final"]
    for name, tensor in single.model.state_dict().items():
        torch.testing.assert_close(exported[name], tensor, atol=1e-5, rtol=1e-4)
