"""The `torch` trainer on CUDA: pinned snapshot, bit-exact swap, export, checkpoints, FSDP2 over NCCL."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.multiprocessing as mp
from fsdp_worker import MICRO, OPTIM, ROWS, run_rank
from trainer_helpers import build_tiny_lm, random_batch, token_mean_pg_loss

from engine.trainer.fsdp import free_port
from engine.trainer.torch_trainer import TorchTrainerBackend

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_cuda_trainer_snapshot_export_and_checkpoint(tmp_path) -> None:
    model = build_tiny_lm()
    trainer = TorchTrainerBackend(copy.deepcopy(model), optim_cfg={"lr": 1e-3}, micro_batch_size=4, device="cuda")
    cpu = TorchTrainerBackend(copy.deepcopy(model), optim_cfg={"lr": 1e-3}, micro_batch_size=4)
    batch = random_batch()
    gpu_lp, _ = trainer.compute_log_probs(batch)
    cpu_lp, _ = cpu.compute_log_probs(batch)
    torch.testing.assert_close(gpu_lp, cpu_lp, atol=1e-4, rtol=0)
    trainer.snapshot_params()
    assert all(t.is_pinned() for t in trainer._snapshot)
    metrics = trainer.train_step(batch, token_mean_pg_loss)
    assert metrics["actor/grad_norm"] > 0
    live = [p.detach().clone() for p in trainer.model.parameters()]
    prox = trainer.proximal_log_probs(batch)
    assert all(torch.equal(a, b) for a, b in zip(live, trainer.model.parameters()))
    torch.testing.assert_close(prox, gpu_lp, atol=1e-6, rtol=0)
    exported = {n: a for b in trainer.export_weights(1 << 16) for n, a in b.items()}
    assert "lm_head.weight" in exported
    trainer.save(str(tmp_path / "c"))
    other = TorchTrainerBackend(build_tiny_lm(seed=3), optim_cfg={"lr": 1e-3}, micro_batch_size=4, device="cuda")
    other.load(str(tmp_path / "c"))
    for a, b in zip(trainer.model.parameters(), other.model.parameters()):
        assert torch.equal(a, b)


def test_fsdp_over_nccl_single_rank_matches_plain_trainer(tmp_path) -> None:
    mp.start_processes(run_rank, args=(1, free_port(), str(tmp_path), "nccl"), nprocs=1, join=True,
                       start_method="spawn")
    result = torch.load(tmp_path / "rank0.pt", weights_only=False)
    single = TorchTrainerBackend(build_tiny_lm(seed=0), optim_cfg=OPTIM, grad_clip=1e6, micro_batch_size=MICRO,
                                 device="cuda")
    reference = single.train_step(random_batch(rows=ROWS, seed=0), token_mean_pg_loss)
    for name, tensor in single.model.state_dict().items():
        torch.testing.assert_close(result["export"][name], tensor.cpu(), atol=1e-5, rtol=0)
    assert abs(result["metrics_step1"]["actor/grad_norm"] - reference["actor/grad_norm"]) < 1e-4
    assert result["losses"][-1] < result["losses"][0]
