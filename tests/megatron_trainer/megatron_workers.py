"""Rank bodies of the multi-process Megatron tests (run under `megatron_helpers.spawn`, gloo)."""

from __future__ import annotations

from typing import Any

import torch
from megatron_helpers import make_batch, nll_loss

TEMPERATURE = 0.7


def _params(backend: Any) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in backend.model.named_parameters()}


def exercise(backend: Any, batch: Any, steps: int = 2) -> dict[str, Any]:
    """Log-probs, export, snapshot → `steps` updates → proximal log-probs, with the swap checked bit-exactly."""
    from engine.trainer.megatron import export

    log_probs, entropy = backend.compute_log_probs(batch, with_entropy=True)
    before = export.gathered_bytes
    exported = backend.hf_state_dict()
    all_gathered = export.gathered_bytes - before  # every rank receives every shard
    sync = {n: t.clone() for b in backend.export_weights(1 << 16) for n, t in b.items()}
    to_sender = export.gathered_bytes - before - all_gathered  # only each group's first rank receives
    backend.snapshot_params()
    metrics = [backend.train_step(batch, nll_loss) for _ in range(steps)]
    live = _params(backend)
    prox = backend.proximal_log_probs(batch)
    restored = all(torch.equal(p, live[n]) for n, p in _params(backend).items())
    return {
        "log_probs": log_probs, "entropy": entropy, "export": exported, "prox": prox, "restored": restored,
        "sync_export": sync, "gathered": {"all_gather": all_gathered, "to_sender": to_sender},
        "losses": [m["actor/loss"] for m in metrics], "grad_norms": [m["actor/grad_norm"] for m in metrics],
        "snapshot_bytes": backend.snapshot.nbytes,
        "param_bytes": sum(p.numel() * p.element_size() for p in backend.model.parameters()),
        "expert_buffers": len(backend.ddp.expert_parallel_buffers),
    }


def tensor_parallel_rank(rank: int, world: int, port: int, dirs: dict[str, str]) -> dict[str, Any]:
    """TP = world: every rank sees the whole batch."""
    from engine.trainer.megatron.backend import MegatronTrainerBackend

    out = {}
    for kind, directory in dirs.items():
        backend = MegatronTrainerBackend(directory, tp=world, optim_cfg={"lr": 1e-2}, micro_batch_size=2,
                                         temperature=TEMPERATURE, grad_clip=1e9, rank=rank, world_size=world,
                                         master_port=port)
        out[kind] = exercise(backend, make_batch())
    return out


def expert_parallel_rank(rank: int, world: int, port: int, directory: str, ckpt: str) -> dict[str, Any]:
    """EP = DP = world, TP = 1: rank r trains on its half of the rows; then a decoupled-mode checkpoint
    (snapshot → train → prox → save) is loaded into a fresh backend."""
    from engine.trainer.megatron.backend import MegatronTrainerBackend

    def build() -> MegatronTrainerBackend:
        return MegatronTrainerBackend(directory, ep=world, optim_cfg={"lr": 1e-2}, micro_batch_size=1,
                                      temperature=TEMPERATURE, grad_clip=1e9, rank=rank, world_size=world,
                                      master_port=port)

    full = make_batch(rows=4)
    rows = len(full) // world
    mine = full.select(slice(rank * rows, (rank + 1) * rows))
    backend = build()
    out = exercise(backend, mine)
    backend.save(ckpt)
    again = build()
    again.load(ckpt)
    out["reloaded_equal"] = all(torch.equal(p, _params(backend)[n]) for n, p in _params(again).items())
    out["reloaded_prox_equal"] = bool(torch.equal(again.proximal_log_probs(mine), backend.proximal_log_probs(mine)))
    return out


def pipeline_parallel_rank(rank: int, world: int, port: int, dirs: dict[str, str], ckpt: str) -> dict[str, Any]:
    """PP = world, TP = DP = 1: every stage sees the whole batch; then save → load into a fresh backend."""
    from engine.trainer.megatron.backend import MegatronTrainerBackend

    out = {}
    for kind, directory in dirs.items():
        def build() -> MegatronTrainerBackend:
            return MegatronTrainerBackend(directory, pp=world, optim_cfg={"lr": 1e-2}, micro_batch_size=2,
                                          temperature=TEMPERATURE, grad_clip=1e9, rank=rank, world_size=world,
                                          master_port=port)

        backend = build()
        batch = make_batch()
        out[kind] = exercise(backend, batch)
        backend.save(f"{ckpt}/{kind}")
        again = build()
        again.load(f"{ckpt}/{kind}")
        out[kind]["reloaded_equal"] = all(torch.equal(p, _params(backend)[n]) for n, p in _params(again).items())
        out[kind]["reloaded_prox_equal"] = bool(torch.equal(again.proximal_log_probs(batch),
                                                            backend.proximal_log_probs(batch)))
        out[kind]["after_lp"] = backend.compute_log_probs(batch)[0]
        out[kind]["after_export"] = backend.hf_state_dict()
    return out


def pipeline_expert_rank(rank: int, world: int, port: int, directory: str) -> dict[str, Any]:
    """PP 2 × EP 2 × DP 2 (world 4): each DP replica (a two-stage pipeline) trains on its half of the rows."""
    from engine.trainer.megatron.backend import MegatronTrainerBackend

    backend = MegatronTrainerBackend(directory, pp=2, ep=2, optim_cfg={"lr": 1e-2}, micro_batch_size=1,
                                     temperature=TEMPERATURE, grad_clip=1e9, rank=rank, world_size=world,
                                     master_port=port)
    full = make_batch(rows=4)
    half = len(full) // 2
    mine = full.select(slice(backend.dp_rank * half, (backend.dp_rank + 1) * half))
    out = exercise(backend, mine)
    out["dp_rank"] = backend.dp_rank
    out["export"] = {}  # compared in the PP 2 test; keep the payload small
    return out


def memory_modes_rank(rank: int, world: int, port: int, directory: str) -> dict[str, Any]:
    """TP = world on a MoE model, four ways: plain (expert-TP = TP, Megatron's default before `etp`), etp = 1
    (verl's default), etp = 1 with full recompute and a chunked log-prob head, and a frozen reference."""
    from engine.trainer.megatron.backend import MegatronTrainerBackend

    out: dict[str, Any] = {}
    common = {"tp": world, "optim_cfg": {"lr": 1e-2}, "micro_batch_size": 2, "temperature": TEMPERATURE,
              "grad_clip": 1e9, "rank": rank, "world_size": world, "master_port": port}
    modes = {"plain": {"etp": world}, "etp1": {},
             "etp1-recompute-chunked": {"recompute_granularity": "full", "logprob_chunk_tokens": 4}}
    batch = make_batch(rows=4, response=6)
    for label, kw in modes.items():
        backend = MegatronTrainerBackend(directory, **common, **kw)
        log_probs, _ = backend.compute_log_probs(batch)
        metrics = [backend.train_step(batch, nll_loss) for _ in range(2)]
        out[label] = {"log_probs": log_probs, "losses": [m["actor/loss"] for m in metrics],
                      "grad_norms": [m["actor/grad_norm"] for m in metrics], "weights": backend.hf_state_dict()}
    ref = MegatronTrainerBackend(directory, frozen=True, **common)
    out["ref"] = {"log_probs": ref.compute_log_probs(batch)[0], "optimizer": ref.optimizer is None,
                  "ddp": ref.ddp is ref.model, "grad": any(p.requires_grad for p in ref.model.parameters())}
    return out


def uneven_pipeline_rank(rank: int, world: int, port: int, directory: str, first: int,
                         dense: str) -> dict[str, Any]:
    """PP = world with `first` decoder layers on stage 0 (the rest on the others): this stage's layer count and
    global layer numbers, the log-probs, one update's grad norm with a MoE load-balancing + z-loss, the export;
    then the dense model `dense` with token-budget micro-batches (variable shapes through the pipeline)."""
    from engine.trainer.megatron.backend import MegatronTrainerBackend

    backend = MegatronTrainerBackend(directory, pp=world, optim_cfg={"lr": 1e-2}, micro_batch_size=2,
                                     temperature=TEMPERATURE, grad_clip=1e9, rank=rank, world_size=world,
                                     master_port=port, num_layers_in_first_pipeline_stage=first,
                                     moe_router_load_balancing_type="aux_loss", moe_aux_loss_coeff=0.1,
                                     moe_z_loss_coeff=0.01)
    batch = make_batch()
    layers = backend.model.decoder.layers
    log_probs, _ = backend.compute_log_probs(batch)
    exported = backend.hf_state_dict()
    metrics = backend.train_step(batch, nll_loss)
    # token-budget micro-batches through the pipeline (use_dynamic_bsz): each its own shape, rows reordered
    dynamic = MegatronTrainerBackend(dense, pp=world, optim_cfg={"lr": 1e-2}, temperature=TEMPERATURE,
                                     grad_clip=1e9, rank=rank, world_size=world, master_port=port,
                                     num_layers_in_first_pipeline_stage=first, use_dynamic_bsz=True,
                                     ppo_max_token_len_per_gpu=20, log_prob_max_token_len_per_gpu=12)
    dyn_lp, _ = dynamic.compute_log_probs(batch)
    dyn_metrics = dynamic.train_step(batch, nll_loss)
    return {"layers": len(layers), "layer_numbers": [int(layer.layer_number) for layer in layers],
            "log_probs": log_probs, "metrics": metrics, "export": exported, "dynamic_log_probs": dyn_lp,
            "dynamic_metrics": dyn_metrics}
