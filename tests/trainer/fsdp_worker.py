"""One rank of the 2-process FSDP2 test (spawned by test_fsdp_trainer.py); writes its results to a file."""

from __future__ import annotations

import torch
import torch.distributed as dist
from trainer_helpers import build_tiny_lm, random_batch, token_mean_pg_loss

from engine.trainer.fsdp import FSDPTrainerBackend, init_distributed

OPTIM = {"lr": 1e-3, "weight_decay": 0.0, "eps": 1e-4}
ROWS, MICRO = 8, 2


def rank_slice(batch, rank: int, world: int):
    per = len(batch) // world
    return batch.select(slice(rank * per, (rank + 1) * per))


def run_rank(rank: int, world: int, port: int, out_dir: str, backend: str = "gloo") -> None:
    torch.set_num_threads(1)
    # a file rendezvous on CPU: a port picked in advance can be taken by another process before rank 0 binds it
    init_method = f"file://{out_dir}/rendezvous" if backend == "gloo" else None
    init_distributed(rank, world, port, backend=backend, init_method=init_method)
    device = f"cuda:{torch.cuda.current_device()}" if backend == "nccl" else "cpu"
    try:
        trainer = FSDPTrainerBackend(build_tiny_lm(seed=0), optim_cfg=OPTIM, grad_clip=1e6, micro_batch_size=MICRO,
                                     device=device)
        result: dict = {"tied": trainer.model.lm_head.weight is trainer.model.model.embed_tokens.weight}
        # step 1: the same global batch as the single-process reference, split across ranks
        local = rank_slice(random_batch(rows=ROWS, seed=0), rank, world)
        trainer.snapshot_params()
        before, _ = trainer.compute_log_probs(local)
        result["metrics_step1"] = trainer.train_step(local, token_mean_pg_loss)
        prox = trainer.proximal_log_probs(local)
        result["prox_max_diff"] = float((prox - before).abs().max())
        result["export"] = {n: a.clone() for b in trainer.export_weights(1 << 16) for n, a in b.items()}
        # more steps of likelihood maximisation on this rank's rows: the loss must go down
        sft = rank_slice(random_batch(rows=ROWS, seed=1), rank, world)
        sft.advantages = sft.response_mask.clone()
        # uneven work: rank 1 gets one extra micro-batch (the other rank pads with a zero-weight repeat)
        if rank == 1 and world > 1:
            sft = random_batch(rows=ROWS // world + MICRO, seed=2)
            sft.advantages = sft.response_mask.clone()
        result["losses"] = [trainer.train_step(sft, token_mean_pg_loss)["actor/pg_loss"] for _ in range(6)]
        trainer.save(f"{out_dir}/ckpt")
        result["final"] = {n: a.clone() for b in trainer.export_weights(1 << 16) for n, a in b.items()}
        torch.save(result, f"{out_dir}/rank{rank}.pt")
        dist.barrier()  # neither rank leaves the group while the other may still be talking to it
    finally:
        dist.destroy_process_group()
