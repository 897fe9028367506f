"""One rank of the 2-process token-budget micro-batch test (spawned by test_dynamic_bsz.py)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from fsdp_worker import OPTIM, rank_slice
from trainer_helpers import agg_loss_fn, build_tiny_lm, random_batch

from engine.trainer.fsdp import FSDPTrainerBackend, init_distributed

ROWS, BUDGET = 10, 20


def run_rank(rank: int, world: int, port: int, out_dir: str) -> None:
    """Two local steps (2 mini-batches each) with token-budget micro-batches on this rank's rows; the weights
    after them, the metrics, and the log-probs of this rank's rows."""
    torch.set_num_threads(1)
    init_distributed(rank, world, port, backend="gloo", init_method=f"file://{out_dir}/rendezvous")
    try:
        trainer = FSDPTrainerBackend(build_tiny_lm(seed=0), optim_cfg=OPTIM, grad_clip=1e6, mini_batches=2,
                                     use_dynamic_bsz=True, ppo_max_token_len_per_gpu=BUDGET,
                                     log_prob_max_token_len_per_gpu=BUDGET - 3)
        local = rank_slice(random_batch(rows=ROWS, seed=3, max_prompt=9, max_response=9), rank, world)
        log_probs, _ = trainer.compute_log_probs(local)
        loss = agg_loss_fn(local, "seq-mean-token-sum")
        metrics = [trainer.train_step(local, loss) for _ in range(2)]
        final = {n: a.detach().clone() for b in trainer.export_weights(1 << 16) for n, a in b.items()}
        torch.save({"metrics": metrics, "final": final, "log_probs": log_probs}, f"{out_dir}/rank{rank}.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()
