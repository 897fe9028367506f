"""One rank of the 2-process FSDP2 packed-rows test (spawned by test_fsdp_packed_rows.py): the same rows trained
with packed rows and padded, in fp32, with token-budget micro-batches (the ranks agree on one count)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from fsdp_worker import rank_slice
from trainer_helpers import build_tiny_lm, random_batch, token_mean_pg_loss

from engine.trainer.fsdp import FSDPTrainerBackend, init_distributed

OPTIM = {"lr": 1e-3, "weight_decay": 0.0, "eps": 1e-4}


def _train(packed: bool, rank: int, world: int) -> dict:
    trainer = FSDPTrainerBackend(build_tiny_lm(seed=0), optim_cfg=OPTIM, grad_clip=1e6, shared_prompt=False,
                                 use_remove_padding=packed, use_dynamic_bsz=True, ppo_max_token_len_per_gpu=40)
    local = [rank_slice(random_batch(rows=12, seed=s, max_prompt=9, max_response=8), rank, world) for s in (0, 1)]
    ref = FSDPTrainerBackend(build_tiny_lm(seed=1), optim_cfg=OPTIM, frozen=True, shared_prompt=False,
                             use_remove_padding=packed, use_dynamic_bsz=True, ppo_max_token_len_per_gpu=40)
    ref_log_probs, _ = ref.compute_log_probs(local[0])
    metrics = [trainer.train_step(b, token_mean_pg_loss) for b in local]
    weights = {n: a.detach().clone() for b in trainer.export_weights(1 << 16) for n, a in b.items()}
    return {"ref_log_probs": ref_log_probs * local[0].response_mask, "metrics": metrics, "weights": weights}


def run_rank(rank: int, world: int, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    init_distributed(rank, world, port, backend="gloo", init_method=f"file://{out_dir}/rendezvous")
    try:
        result = {("packed" if packed else "padded"): _train(packed, rank, world) for packed in (True, False)}
        torch.save(result, f"{out_dir}/rank{rank}.pt")
        dist.barrier()  # neither rank leaves the group while the other may still be talking to it
    finally:
        dist.destroy_process_group()
