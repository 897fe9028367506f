"""One rank of the 2-process FSDP2 meta-init test (spawned by test_fsdp_meta_init.py)."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist

import engine.models.loader as loader
from asyncrl_cli.config.loader import load_run_config
from engine.models.loader import resolve_model_path
from engine.plan.devices import RoleDevice
from engine.plan.role_parts import backend_spec
from engine.runtime.backends import build_trainer_backend
from engine.trainer.fsdp import FSDPTrainerBackend, init_distributed

TINY = Path(__file__).resolve().parents[2] / "presets" / "runs" / "tiny-cpu.toml"


def run_rank(rank: int, world: int, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    init_distributed(rank, world, port, backend="gloo", init_method=f"file://{out_dir}/rendezvous")
    try:
        cfg = load_run_config(TINY, ['trainer.precision="fp32"', 'trainer.attn_implementation="sdpa"']).config
        model_dir = str(resolve_model_path(cfg.model.path))
        loads: list[str] = []
        real = loader.load_causal_lm

        def spy(*args, **kwargs):
            loads.append("load")
            return real(*args, **kwargs)

        loader.load_causal_lm = spy
        meta = build_trainer_backend(backend_spec(cfg), model_dir, True, device=RoleDevice("cpu", "none"))
        loader.load_causal_lm = real
        plain = FSDPTrainerBackend(real(model_dir, dtype="float32", attn_implementation="sdpa"), optim_cfg={"lr": 1e-3},
                                   device="cpu")
        mine = {n: p.to_local() for n, p in meta.model.named_parameters()}
        theirs = {n: p.to_local() for n, p in plain.model.named_parameters()}
        bufs = dict(plain.model.named_buffers())
        result = {
            "loads": loads,
            "same_params": mine.keys() == theirs.keys() and all(torch.equal(mine[n], theirs[n]) for n in mine),
            "same_buffers": all(torch.equal(b, bufs[n]) for n, b in meta.model.named_buffers()),
            "tied": meta.model.lm_head.weight is meta.model.model.embed_tokens.weight,
            "any_meta": any(p.is_meta for p in meta.model.parameters()),
            "export": {n: t.clone() for b in meta.export_weights(1 << 16) for n, t in b.items()},
            "export_plain": {n: t.clone() for b in plain.export_weights(1 << 16) for n, t in b.items()},
        }
        torch.save(result, f"{out_dir}/rank{rank}.pt")
        dist.barrier()  # neither rank leaves the group while the other may still be talking to it
    finally:
        dist.destroy_process_group()
