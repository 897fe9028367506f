"""Building the configured backends: the rollout engine of a replica and the training backend of a trainer rank.

Pure construction, no Ray: the actors (`replica.py`, `trainer_actor.py`, `trainer_group.py`) call these, and so
do the benchmarks and the GPU check. The backends themselves are imported lazily, so vLLM and Megatron stay
optional. Every backend is told its device: the actors pass their spec's `RoleDevice` (`engine.plan.roles`, from
`RunPlan.devices`: type, index policy, collective env); a caller without actors resolves the plan first
(`resolve_plan(cfg).devices`) — nothing here reads the hardware preset. The
`hf` replicas and `torch` trainer ranks compute on it (`"ray"` policy: the accelerator Ray gave the actor, index 0
inside it); vLLM gets the engine arguments of that device (`vllm_backend.engine_args`); Megatron its backend.
"""

from __future__ import annotations

from typing import Any

from engine.config.schema import RunConfig  # the actors' config type (they import it from here)
from engine.plan.devices import RoleDevice
from engine.plan.roles import WeightSyncSpec

__all__ = ["RunConfig", "build_reference_backend", "build_rollout_backend", "build_trainer_backend",
           "build_weight_sync", "rollout_dtype"]


def check_device(device: str) -> str:
    """Fail with one clear line when this worker cannot reach `device` (returns it otherwise)."""
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("the hardware preset says device = \"cuda\", but this worker sees no CUDA GPU "
                           "(check the node's drivers and that Ray counts its GPUs: `ray status`)")
    if device == "npu":
        try:
            import torch_npu  # noqa: F401 — registers torch.npu
        except ImportError:
            raise RuntimeError('the hardware preset says device = "npu", but torch_npu is not installed '
                               "on this worker") from None
    return device


AUTO_UNRESOLVED = ('{key} = "auto" is decided at launch (engine.launch.probe.resolve_auto); resolve the config '
                   "before building a backend")

ROLLOUT_DTYPES = {"fp32": "float32", "bf16": "bfloat16"}
"""`rollout.dtype` → torch dtype name."""


def rollout_dtype(cfg: RunConfig) -> str:
    """The rollout's torch dtype name: `rollout.dtype` when set, else the trainer's `model.dtype`."""
    chosen = getattr(cfg.rollout, "dtype", None)
    if chosen == "auto":
        raise ValueError(AUTO_UNRESOLVED.format(key="rollout.dtype"))
    return ROLLOUT_DTYPES[chosen] if chosen else cfg.model.dtype


def deterministic_threads(cfg: RunConfig) -> None:
    """`trainer.deterministic`: one intra-op thread in this process, whatever the core split gave it (a
    reduction's summation order, hence its last bits, can follow the thread count, which differs between
    `mode = "sync"` and fully async placements)."""
    if cfg.trainer.deterministic:
        import torch

        torch.set_num_threads(1)


def vllm_options(cfg: RunConfig, device: RoleDevice) -> dict[str, Any]:
    """The `VLLMRolloutBackend` keywords of one replica of `cfg` on `device` (its engine arguments:
    `vllm_backend.engine_args(model_dir, **vllm_options(...))`)."""
    import os

    # a TP > 1 replica placed on several placement-group bundles (engine.runtime.placement_groups) holds no
    # accelerator itself: vLLM's Ray executor starts its TP workers on those bundles
    bundles = device.index_policy == "bundles" or bool(os.environ.get("VLLM_RAY_BUNDLE_INDICES"))
    return {"device": device.type, "tensor_parallel_size": cfg.rollout.tensor_parallel_size,
            "gpu_memory_utilization": cfg.rollout.gpu_memory_utilization, "max_num_seqs": cfg.rollout.max_num_seqs,
            "max_model_len": cfg.data.max_prompt_length + cfg.data.max_response_length,
            "dtype": rollout_dtype(cfg), "seed": cfg.trainer.seed,
            "distributed_executor_backend": "ray" if bundles else None}


def build_rollout_backend(cfg: RunConfig, model_dir: str, device: RoleDevice):
    """The configured rollout backend for `model_dir` (imported lazily), in `rollout_dtype(cfg)`, on `device` (the
    plan's rollout `RoleDevice`)."""
    from engine.models.loader import load_causal_lm, load_tokenizer

    deterministic_threads(cfg)
    if cfg.rollout.backend == "vllm":
        from engine.rollout.vllm.backend import VLLMRolloutBackend

        return VLLMRolloutBackend(model_dir, **vllm_options(cfg, device))
    from engine.rollout.hf.backend import HFRolloutBackend

    tok = load_tokenizer(model_dir)
    model = load_causal_lm(model_dir, dtype=rollout_dtype(cfg))
    return HFRolloutBackend(
        model,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
        max_batch_size=cfg.rollout.max_num_seqs,
        device=check_device(device.type),
        deterministic=cfg.trainer.deterministic,
    )


def build_trainer_backend(cfg: RunConfig, model_dir: str, distributed: bool = False, *, frozen: bool = False,
                          device: RoleDevice, load_model: Any = None, hf_weights: Any = None):
    """The configured training backend for `model_dir` (backends imported lazily). `distributed`: this process
    is one rank of a trainer group (`engine.runtime.trainer_group`, process group already joined), so the torch
    backend is the FSDP2 one and Megatron builds its TP/PP/CP/EP/DP groups over that world. Both compute on
    `device` (the plan's trainer `RoleDevice`). Precision:
    `engine.config.precision` (parameters in `policy.params`, compute in `policy.compute`). `frozen`: the KL
    loss's reference model (`build_reference_backend`): no gradients, optimizer or DDP wrapper, weights offloaded
    between uses when `trainer.ref_param_offload`. `load_model`: the torch backend's model loader, called as
    `load_causal_lm` is, and `hf_weights`: Megatron's source of HF tensors in place of the directory's safetensors
    (`engine.rehearse` builds both from the model's config.json on fake tensors)."""
    from engine.config.precision import policy_of

    deterministic_threads(cfg)
    if cfg.trainer.precision == "auto":
        raise ValueError(AUTO_UNRESOLVED.format(key="trainer.precision"))
    if cfg.trainer.attn_implementation == "auto":
        raise ValueError(AUTO_UNRESOLVED.format(key="trainer.attn_implementation"))
    t = cfg.trainer
    policy = policy_of(cfg)
    temperature = cfg.rollout.temperature if cfg.rollout.temperature > 0 else 1.0
    optim = t.optim.model_dump()
    if optim.pop("name", "adamw") != "adamw":
        raise ValueError(f"trainer.optim.name = {t.optim.name!r}: only 'adamw' is supported")
    # verl's actor loop: require_batches mini-batches × ppo_epochs passes per local step
    update = {"mini_batches": cfg.async_training.require_batches, "ppo_epochs": t.ppo_epochs,
              "shuffle": t.shuffle}
    common = {"optim_cfg": optim, "grad_clip": t.grad_clip, "micro_batch_size": t.ppo_micro_batch_size_per_gpu,
              "temperature": temperature, "seed": t.seed, "frozen": frozen,
              "param_offload": frozen and t.ref_param_offload, "use_dynamic_bsz": t.use_dynamic_bsz,
              "ppo_max_token_len_per_gpu": t.ppo_max_token_len_per_gpu,
              "log_prob_max_token_len_per_gpu": t.log_prob_max_token_len_per_gpu, **update}
    if t.backend == "megatron":
        from engine.trainer.megatron.backend import MegatronTrainerBackend

        world: dict[str, Any] = {}
        if distributed:
            import torch.distributed as dist

            world = {"rank": dist.get_rank(), "world_size": dist.get_world_size()}
        return MegatronTrainerBackend(
            model_dir, tp=t.tp, pp=t.pp, cp=t.cp, ep=t.ep, etp=t.etp, dtype=policy.compute,
            fp32_master_weights=policy.params == "float32", recompute_granularity=t.recompute_granularity,
            recompute_method=t.recompute_method, recompute_num_layers=t.recompute_num_layers,
            logprob_chunk_tokens=t.logprob_chunk_tokens, device=device.type, hf_weights=hf_weights, **common, **world,
        )
    from engine.models.loader import load_causal_lm, meta_causal_lm
    from engine.trainer.torch_trainer import TorchTrainerBackend

    # a frozen reference holds no optimizer state: its weights need no fp32 masters
    load = load_model or load_causal_lm
    spec = {"dtype": policy.compute if frozen else policy.params, "attn_implementation": t.attn_implementation}
    import torch.distributed as dist

    # FSDP2: rank 0 loads, the others get their shards from it. A rehearsal (`load_model` given) builds the ranks
    # other than 0 from their own fake load: torch's fake process group cannot carry rank 0's broadcast.
    if distributed and not (frozen and t.ref_param_offload) and (load_model is None or dist.get_rank() == 0):
        from engine.trainer.fsdp import FSDPTrainerBackend

        loaded = load(model_dir, **spec) if dist.get_rank() == 0 else None
        skeleton = meta_causal_lm(model_dir, **spec)
        return FSDPTrainerBackend(skeleton, loaded=loaded, **trainer_kwargs(cfg, policy, device, frozen, common))
    model = load(model_dir, **spec)
    kwargs = trainer_kwargs(cfg, policy, device, frozen, common)
    if distributed:
        from engine.trainer.fsdp import FSDPTrainerBackend

        return FSDPTrainerBackend(model, **kwargs)
    return TorchTrainerBackend(model, **kwargs)


def trainer_kwargs(cfg: RunConfig, policy: Any, device: RoleDevice, frozen: bool, common: dict[str, Any]) -> dict:
    """The torch / FSDP2 backend's keyword arguments beyond the model."""
    from engine.config.precision import SHORT

    t = cfg.trainer
    return {"device": check_device(device.type), "precision": SHORT[policy.compute],
            "gradient_checkpointing": t.enable_gradient_checkpointing,
            "logprob_chunk_tokens": t.logprob_chunk_tokens, "shared_prompt": t.shared_prompt,
            "use_remove_padding": t.use_remove_padding,
            "export_dtype": None if frozen else rollout_dtype(cfg), **common}  # syncs in the replicas' dtype


def build_reference_backend(cfg: RunConfig, model_dir: str, distributed: bool = False, *, device: RoleDevice,
                            load_model: Any = None, hf_weights: Any = None):
    """The frozen reference policy of the KL loss (`trainer.use_kl_loss`): `build_trainer_backend(frozen=True)`."""
    return build_trainer_backend(cfg, model_dir, distributed, frozen=True, device=device, load_model=load_model,
                                 hf_weights=hf_weights)


def build_weight_sync(spec: WeightSyncSpec, run_id: str = "run"):
    """The weight-sync transport of `spec` (`engine.plan.roles.WeightSyncSpec`: `rollout.weight_sync`, the plan's
    trainer device, the receiving ranks — R replicas, for vLLM each replica's t TP workers: R × t) for trainer
    rank 0 (call it in that process): `engine.sync.runtime.weight_transport` with the device's collective backend,
    meeting at this node's IP and a free port."""
    from engine.sync.runtime import SHM_SLOT_BYTES, weight_transport

    if spec.transport not in ("collective", "shared_memory"):
        return weight_transport(spec.transport, spec.device)
    import ray

    from engine.plan.devices import COLLECTIVE_BACKEND
    from engine.trainer.fsdp import free_port

    return weight_transport(spec.transport, spec.device, COLLECTIVE_BACKEND.get(spec.device, ""),
                            ray.util.get_node_ip_address(), free_port(), spec.receivers, spec.per_replica,
                            run_id=run_id, slot_bytes=min(SHM_SLOT_BYTES, spec.bucket_bytes))
