"""One rank of the 2-process row-shard test (spawned by test_row_shards.py); writes its results to a file."""

from __future__ import annotations

import torch
import torch.distributed as dist
from trainer_helpers import build_tiny_lm, random_batch, token_mean_pg_loss

from engine.trainer.batch import is_filler, shard_rows
from engine.trainer.fsdp import FSDPTrainerBackend, init_distributed

OPTIM = {"lr": 1e-3, "weight_decay": 0.0, "eps": 1e-4}
ROWS, MICRO = 7, 2  # 7 rows over 2 ranks: shards of 4 and 3, an uneven number of micro-batches


def run_shard_rank(rank: int, world: int, port: int, out_dir: str) -> None:
    """Log-probs of this rank's shard of a 7-row batch; then a 1-row batch, where rank 1 only has a filler
    shard, through `compute_log_probs` and one `train_step`; the weights after it (rank 0)."""
    torch.set_num_threads(1)
    init_distributed(rank, world, port, backend="gloo", init_method=f"file://{out_dir}/rendezvous")
    try:
        trainer = FSDPTrainerBackend(build_tiny_lm(seed=0), optim_cfg=OPTIM, grad_clip=1e6, micro_batch_size=MICRO)
        result: dict = {}
        result["log_probs"], _ = trainer.compute_log_probs(shard_rows(random_batch(rows=ROWS, seed=4), world)[rank])
        shard = shard_rows(random_batch(rows=1, seed=5), world)[rank]
        result["filler"] = is_filler(shard)
        result["one_log_probs"], result["one_entropy"] = trainer.compute_log_probs(shard, with_entropy=True)
        result["metrics"] = trainer.train_step(shard, token_mean_pg_loss)
        result["export"] = {n: a.clone() for b in trainer.export_weights(1 << 16) for n, a in b.items()}
        torch.save(result, f"{out_dir}/rank{rank}.pt")
        dist.barrier()  # neither rank leaves the group while the other may still be talking to it
    finally:
        dist.destroy_process_group()
