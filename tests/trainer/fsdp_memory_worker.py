"""One rank of the 2-process FSDP2 memory-modes test (spawned by test_fsdp_memory_modes.py): the plain path,
gradient checkpointing + the chunked head, bf16 compute over fp32 shards, and a frozen reference."""

from __future__ import annotations

import torch
import torch.distributed as dist
from fsdp_worker import rank_slice
from torch.distributed.tensor import DTensor
from trainer_helpers import build_tiny_lm, build_tiny_moe_lm, random_batch, token_mean_pg_loss

from engine.trainer.fsdp import FSDPTrainerBackend, init_distributed

OPTIM = {"lr": 1e-3, "weight_decay": 0.0, "eps": 1e-4}
ROWS = 8


def _two_updates(trainer: FSDPTrainerBackend, rank: int, world: int) -> dict:
    local = rank_slice(random_batch(rows=ROWS, seed=0, max_response=9), rank, world)
    metrics = [trainer.train_step(local, token_mean_pg_loss) for _ in range(2)]
    weights = {n: a.detach().clone() for b in trainer.export_weights(1 << 16) for n, a in b.items()}
    return {"metrics": metrics, "weights": weights}


def run_rank(rank: int, world: int, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    init_distributed(rank, world, port, backend="gloo", init_method=f"file://{out_dir}/rendezvous")
    try:
        result: dict = {}
        for kind, build in (("dense", build_tiny_lm), ("moe", build_tiny_moe_lm)):
            common = {"optim_cfg": OPTIM, "grad_clip": 1e6, "micro_batch_size": 2}
            result[f"{kind}/plain"] = _two_updates(FSDPTrainerBackend(build(seed=0), **common), rank, world)
            result[f"{kind}/memory"] = _two_updates(FSDPTrainerBackend(
                build(seed=0), gradient_checkpointing=True, logprob_chunk_tokens=3, **common), rank, world)
        # bf16 compute over fp32 shards (MixedPrecisionPolicy) at the presets' lr
        mixed = FSDPTrainerBackend(build_tiny_lm(seed=0), optim_cfg={"lr": 1e-6, "weight_decay": 0.0},
                                   grad_clip=1e6, micro_batch_size=2, precision="bf16", logprob_chunk_tokens=3)
        shards = [p.to_local() if isinstance(p, DTensor) else p for p in mixed.model.parameters()]
        result["mixed/shard_dtypes"] = sorted({str(p.dtype) for p in shards})
        before = [s.detach().clone() for s in shards]
        local = rank_slice(random_batch(rows=ROWS, seed=0), rank, world)
        lp32, _ = FSDPTrainerBackend(build_tiny_lm(seed=0), optim_cfg=OPTIM).compute_log_probs(local)
        lp16, _ = mixed.compute_log_probs(local)
        result["mixed/logprob_diff"] = float((lp16 - lp32).abs().max())
        mixed.train_step(local, token_mean_pg_loss)
        result["mixed/state_dtypes"] = sorted({str(v.dtype) for s in mixed.optimizer.state.values()
                                               for k, v in s.items() if k != "step"})
        result["mixed/moved"] = sum(int((s.detach() != b).sum()) for s, b in zip(shards, before))
        result["mixed/numel"] = sum(b.numel() for b in before)
        # the frozen reference: sharded, no optimizer, no gradients, the policy's log-probs
        ref = FSDPTrainerBackend(build_tiny_lm(seed=0), optim_cfg=OPTIM, frozen=True)
        result["ref/optimizer"] = ref.optimizer is None
        result["ref/requires_grad"] = any(p.requires_grad for p in ref.model.parameters())
        got, _ = ref.compute_log_probs(local)
        result["ref/logprob_diff"] = float((got - lp32).abs().max())
        torch.save(result, f"{out_dir}/rank{rank}.pt")
        dist.barrier()  # neither rank leaves the group while the other may still be talking to it
    finally:
        dist.destroy_process_group()
