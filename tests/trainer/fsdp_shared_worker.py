"""One rank of the 2-process FSDP2 shared-prompt test (spawned by test_fsdp_shared_prompt.py): the same GRPO
groups trained with and without the shared-prompt forward, in fp32 and with bf16 compute over fp32 shards."""

from __future__ import annotations

import torch
import torch.distributed as dist
from fsdp_worker import rank_slice
from trainer_helpers import build_tiny_lm, group_batch, token_mean_pg_loss

from engine.trainer.fsdp import FSDPTrainerBackend, init_distributed

OPTIM = {"lr": 1e-3, "weight_decay": 0.0, "eps": 1e-4}


def _train(shared: bool, rank: int, world: int, **kw: object) -> dict:
    trainer = FSDPTrainerBackend(build_tiny_lm(seed=0), optim_cfg=OPTIM, grad_clip=1e6, micro_batch_size=8,
                                 shared_prompt=shared, **kw)
    local = [rank_slice(group_batch(groups=4, n=4, seed=s), rank, world) for s in (0, 1)]  # 2 whole groups a rank
    log_probs, _ = trainer.compute_log_probs(local[0])
    metrics = [trainer.train_step(b, token_mean_pg_loss) for b in local]
    weights = {n: a.detach().clone() for b in trainer.export_weights(1 << 16) for n, a in b.items()}
    return {"log_probs": log_probs * local[0].response_mask, "metrics": metrics, "weights": weights}


def run_rank(rank: int, world: int, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    init_distributed(rank, world, port, backend="gloo", init_method=f"file://{out_dir}/rendezvous")
    try:
        result = {f"{prec}/{'shared' if shared else 'padded'}": _train(shared, rank, world, precision=prec)
                  for prec in ("fp32", "bf16") for shared in (True, False)}
        torch.save(result, f"{out_dir}/rank{rank}.pt")
        dist.barrier()  # neither rank leaves the group while the other may still be talking to it
    finally:
        dist.destroy_process_group()
