"""One rank of the 2-process FSDP2 mini-batch test (spawned by test_fsdp_minibatch.py)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from fsdp_worker import MICRO, OPTIM, ROWS, rank_slice
from trainer_helpers import build_tiny_lm, random_batch, token_mean_pg_loss

from engine.trainer.fsdp import FSDPTrainerBackend, init_distributed


def run_rank(rank: int, world: int, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    init_distributed(rank, world, port, backend="gloo", init_method=f"file://{out_dir}/rendezvous")
    try:
        trainer = FSDPTrainerBackend(build_tiny_lm(seed=0), optim_cfg=OPTIM, grad_clip=1e6, micro_batch_size=MICRO,
                                     mini_batches=2, ppo_epochs=2)
        local = rank_slice(random_batch(rows=ROWS, seed=0), rank, world)
        metrics = trainer.train_step(local, token_mean_pg_loss)
        final = {n: a.clone() for b in trainer.export_weights(1 << 16) for n, a in b.items()}
        torch.save({"metrics": metrics, "final": final, "steps": trainer.global_step}, f"{out_dir}/rank{rank}.pt")
        dist.barrier()  # neither rank leaves the group while the other may still be talking to it
    finally:
        dist.destroy_process_group()
