"""One rank of the 2-process FSDP2 export test (spawned by test_fsdp_export.py); writes its results to a file."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed.checkpoint.state_dict as dcp_state
from fsdp_worker import MICRO, OPTIM, ROWS, rank_slice
from trainer_helpers import build_tiny_lm, random_batch, token_mean_pg_loss

from engine.trainer import torch_weights
from engine.trainer.fsdp import FSDPTrainerBackend, init_distributed


def run_rank(rank: int, world: int, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    init_distributed(rank, world, port, backend="gloo", init_method=f"file://{out_dir}/rendezvous")
    try:
        trainer = FSDPTrainerBackend(build_tiny_lm(seed=0), optim_cfg=OPTIM, grad_clip=1e6, micro_batch_size=MICRO,
                                     precision="bf16", export_dtype="bfloat16")
        trainer.train_step(rank_slice(random_batch(rows=ROWS, seed=0), rank, world), token_mean_pg_loss)
        trainer.compute_log_probs(rank_slice(random_batch(rows=ROWS, seed=1), rank, world))
        full_calls: list[str] = []

        def spy(*args, **kwargs):  # no full state dict may be built for a sync
            full_calls.append("get_model_state_dict")
            return real(*args, **kwargs)

        real = dcp_state.get_model_state_dict
        torch_weights.get_model_state_dict = spy
        dcp_state.get_model_state_dict = spy
        buckets = list(trainer.export_weights(1 << 12))
        torch_weights.get_model_state_dict = dcp_state.get_model_state_dict = real
        result = {"calls": full_calls, "buckets": len(buckets),
                  "export": {n: t.clone() for b in buckets for n, t in b.items()},
                  "reference": {n: t.clone() for n, t in trainer.full_state_dict().items()}}
        torch.save(result, f"{out_dir}/rank{rank}.pt")
        dist.barrier()  # neither rank leaves the group while the other may still be talking to it
    finally:
        dist.destroy_process_group()
