"""One rank of the 2-process FSDP2 sharded-checkpoint test (spawned by test_fsdp_checkpoint.py)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from fsdp_worker import MICRO, OPTIM, ROWS, rank_slice
from trainer_helpers import build_tiny_lm, random_batch, token_mean_pg_loss

from engine.trainer import torch_weights
from engine.trainer.fsdp import FSDPTrainerBackend, init_distributed
from engine.trainer.process_groups import checkpoint_group


def _trainer(seed: int) -> FSDPTrainerBackend:
    return FSDPTrainerBackend(build_tiny_lm(seed=seed), optim_cfg=OPTIM, grad_clip=1.0, micro_batch_size=MICRO)


def _params(trainer: FSDPTrainerBackend) -> dict[str, torch.Tensor]:
    return {n: p.to_local().detach().clone() for n, p in trainer.model.named_parameters()}


def run_rank(rank: int, world: int, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    init_distributed(rank, world, port, backend="gloo", init_method=f"file://{out_dir}/rendezvous")
    try:
        a = _trainer(0)
        for step in range(2):
            if step == 1:
                a.snapshot_params()  # a sync: the version's weights; the save below is one step past it
            a.train_step(rank_slice(random_batch(rows=ROWS, seed=step), rank, world), token_mean_pg_loss)
        gathered: list[str] = []
        real = torch_weights.full_state_dict
        torch_weights.full_state_dict = lambda t: gathered.append("full") or real(t)  # spy: no full gather
        a.save(f"{out_dir}/ckpt")
        a.save_version(f"{out_dir}/ckpt")
        torch_weights.full_state_dict = real
        after_save = torch.rand(3)
        nxt = rank_slice(random_batch(rows=ROWS, seed=5), rank, world)
        ma = a.train_step(nxt, token_mean_pg_loss)

        b = _trainer(7)  # other initial weights: everything must come from the checkpoint
        b.load(f"{out_dir}/ckpt")
        restored_rng = torch.equal(torch.rand(3), after_save)
        version = b.load_version(f"{out_dir}/ckpt") and all(torch.equal(x, y) for x, y in zip(a._snapshot, b._snapshot))
        mb = b.train_step(nxt, token_mean_pg_loss)
        pa, pb = _params(a), _params(b)
        group = checkpoint_group()
        result = {"gathered": gathered, "restored_rng": restored_rng, "step": b.global_step,
                  "same_metrics": ma["actor/grad_norm"] == mb["actor/grad_norm"] and ma["actor/lr"] == mb["actor/lr"],
                  "same_params": all(torch.equal(pa[n], pb[n]) for n in pa), "same_version": version,
                  "group_backend": dist.get_backend(group),
                  "group_timeout_s": group._get_backend(torch.device("cpu")).options._timeout.total_seconds()}
        torch.save(result, f"{out_dir}/rank{rank}.pt")
        dist.barrier()  # neither rank leaves the group while the other may still be talking to it
    finally:
        dist.destroy_process_group()
