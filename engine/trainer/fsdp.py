"""The `torch` trainer across M > 1 ranks: FSDP2 (`fully_shard`) over gloo (CPU), NCCL (CUDA) or HCCL (NPU).

Each decoder layer is its own FSDP unit, plus the root (embeddings, final norm, tied `lm_head`); the shards are
fp32 master weights and a bf16 compute dtype is FSDP2's `MixedPrecisionPolicy` (`shard_model`). Every
rank trains on its own rows; FSDP's reduce-scatter *averages* gradients over the M ranks, so each rank
scales its micro-batch weights by M and normalises by the *global* mass:

    g = (1/M) Σ_ranks M Σ_i (m_i / Σ_all-ranks m) ∇L_i = Σ_all micro-batches (m_i / Σ m) ∇L_i

— the gradient of one process training on all rows. Ranks run the same number of micro-batches
(the short ones repeat their last micro-batch with weight 0), because each forward is collective.
Start-up (`shard_from_rank0`): rank 0 alone loads the weights (on its host); every rank builds the model on the
meta device, shards it, allocates its shards on the device and receives them from rank 0 by broadcast.
Weights leave rank 0 gathered tensor by tensor on the device in the export dtype (`torch_weights.export_sharded`:
no full state dict, no host round trip); checkpoints are sharded, each rank writing its own shards
(`torch_weights.save_sharded`, torch distributed checkpoint; `load` re-shards to any world size).

`ulysses_sequence_parallel_size = s > 1` (`engine.trainer.ulysses`): groups of s consecutive ranks share their
rows (data-parallel index ⌊r/s⌋, `dp_rank`) and split each row's sequence; every rank of a group computes the
same loss, so sums over ranks are divided by s (`_sum_across_ranks`: each group's masses and metrics once),
and the token budgets are per SP group (× s, verl's count). FSDP2 still shards over all M ranks.
"""

from __future__ import annotations

import os
import socket
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from engine.plan.devices import PROCESS_GROUP_TIMEOUT_S, RoleDevice
from engine.plan.sequence_parallel import group_budget
from engine.trainer.process_groups import all_reduce_values, init_process_group
from engine.trainer import torch_weights
from engine.trainer.torch_trainer import TorchTrainerBackend
from engine.trainer.ulysses import SequenceParallel, check_sp, sp_group


def free_port() -> int:
    """A currently free TCP port on localhost (for `MASTER_PORT`)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def init_distributed(rank: int, world_size: int, master_port: int, master_addr: str = "127.0.0.1",
                     backend: str | None = None, timeout_s: float = PROCESS_GROUP_TIMEOUT_S,
                     init_method: str | None = None, device: RoleDevice | str | None = None) -> None:
    """Join the default process group of ranks computing on `device` (`engine.trainer.process_groups`: gloo on
    CPU, `cpu:gloo,<device>:<nccl|hccl>` on accelerators, unless `backend` says). The rendezvous is
    `master_addr:master_port`, or `init_method` when given (e.g. `file:///tmp/x`: no port to pick, so no race
    with other processes taking the port between `free_port()` and the bind)."""
    os.environ["MASTER_ADDR"] = master_addr
    os.environ["MASTER_PORT"] = str(master_port)
    init_process_group(rank, world_size, init_method, device, backend, timeout_s)


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated transformer blocks of an HF causal LM (`model.get_decoder().layers`)."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", model)
    layers = getattr(decoder, "layers", None)
    if layers is None:
        raise ValueError(f"cannot find decoder layers on {type(model).__name__}")
    return list(layers)


def shard_model(model: torch.nn.Module, device_type: str, compute_dtype: torch.dtype | None = None,
                offload: bool = False) -> torch.nn.Module:
    """`fully_shard` every vision block (multimodal models), every decoder layer, then the root, over a 1-D
    mesh of all ranks. `compute_dtype` below the parameters' dtype: `MixedPrecisionPolicy(param_dtype=compute,
    reduce_dtype=fp32)` — fp32 shards, compute-dtype all-gathers and matmuls, fp32 reduce-scatter (verl's
    FSDP2 policy). `offload`: the shards live in host memory (`CPUOffloadPolicy`, verl's `param_offload`)."""
    mesh = init_device_mesh(device_type, (dist.get_world_size(),))
    kwargs: dict[str, Any] = {"mesh": mesh}
    param_dtype = next(model.parameters()).dtype
    if compute_dtype is not None and compute_dtype != param_dtype:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    if offload:
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=device_type == "cuda")
    visual = getattr(getattr(model, "model", None), "visual", None)
    for block in getattr(visual, "blocks", []):
        fully_shard(block, **kwargs)
    for layer in decoder_layers(model):
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    return model


def shard_from_rank0(model: torch.nn.Module, loaded: torch.nn.Module | None, device: torch.device,
                     compute_dtype: torch.dtype | None) -> torch.nn.Module:
    """FSDP2 from a meta skeleton (`model`, on every rank) and the weights rank 0 loaded on its host (`loaded`;
    None elsewhere): shard the skeleton (`shard_model`), allocate each rank's shards on `device` (`to_empty`),
    then broadcast rank 0's full state tensor by tensor, every rank keeping its shard
    (`set_model_state_dict(full_state_dict, broadcast_from_rank0)`), and rank 0's buffers (the non-persistent
    ones — rotary frequencies — are in no state dict). No rank but 0 reads the weights; no rank holds the full
    model on the device; tied weights stay tied."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    rank0 = dist.get_rank() == 0
    if rank0 and loaded is None:
        raise ValueError("rank 0 needs the loaded model to shard a meta skeleton from")
    full = loaded.state_dict() if rank0 and loaded is not None else {}
    buffers = dict(loaded.named_buffers()) if rank0 and loaded is not None else {}
    model = shard_model(model, device.type, compute_dtype)
    model.to_empty(device=device)
    set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    with torch.no_grad():
        for name, buf in model.named_buffers():
            if rank0:
                buf.copy_(buffers[name].to(buf.device))
            dist.broadcast(buf, 0)
    return model


class FSDPTrainerBackend(TorchTrainerBackend):
    """`TrainerBackend` for one rank of an FSDP2 group; the default process group must exist. `model`: the loaded
    model, or a meta skeleton (`engine.models.loader.meta_causal_lm`) with rank 0's loaded model as `loaded`
    (`shard_from_rank0`: the other ranks never load the weights)."""

    def __init__(self, model: torch.nn.Module, loaded: torch.nn.Module | None = None,
                 ulysses_sequence_parallel_size: int = 1, **kwargs) -> None:
        if not dist.is_initialized():
            raise RuntimeError("FSDPTrainerBackend needs torch.distributed initialised (see init_distributed)")
        self._rank = dist.get_rank()
        self._world = dist.get_world_size()
        self._loaded = loaded
        self.sp_size = int(ulysses_sequence_parallel_size)
        config = getattr(model, "config", None)
        text = getattr(config, "text_config", None) or config
        heads = int(getattr(text, "num_attention_heads", 1) or 1)
        why = check_sp(self.sp_size, self._world, heads, int(getattr(text, "num_key_value_heads", None) or heads))
        if self.sp_size > 1 and why:
            raise ValueError(why)
        super().__init__(model, **kwargs)
        self.sp: SequenceParallel | None = None
        if self.sp_size > 1:
            self.sp = SequenceParallel(self.model, sp_group(self.sp_size))
            self.packing = None  # the SP forward pads rows to a multiple of s: budgets count what it computes on
            self.ppo_max_token_len = group_budget(self.ppo_max_token_len, self.sp_size)  # verl's per-group count
            self.log_prob_max_token_len = group_budget(self.log_prob_max_token_len, self.sp_size)

    @property
    def dp_rank(self) -> int:
        """This rank's data-parallel index: its SP group's (`engine.runtime.trainer_group` shards rows by it)."""
        return self._rank // self.sp_size

    def _log_probs(self, micro, with_entropy: bool, entropy_grad: bool = False):  # noqa: ANN001, ANN201
        """With SP the sequence is split over the group (`SequenceParallel.log_probs`; padded rows, no shared
        prompt); else the one-rank forward."""
        if self.sp is None:
            return super()._log_probs(micro, with_entropy, entropy_grad)
        self._forward_tokens[0] += micro.input_ids.numel()
        self._forward_tokens[1] += micro.input_ids.numel()
        return self.sp.log_probs(self.model, micro.input_ids, micro.attention_mask, micro.position_ids,
                                 micro.responses, self.temperature, with_entropy, entropy_grad=entropy_grad,
                                 model_kwargs=self._model_kwargs(micro), suppress_ids=self.suppress_ids,
                                 chunk_tokens=self.logprob_chunk_tokens)

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world

    def _prepare_model(self, model: torch.nn.Module) -> torch.nn.Module:
        loaded, self._loaded = self._loaded, None
        if next(model.parameters()).is_meta:
            if self.param_offload:
                raise ValueError("a meta skeleton cannot be offloaded: load the model on every rank for that")
            return shard_from_rank0(model, loaded, self.device, self.compute_dtype)
        return shard_model(model.to(self.device), self.device.type, self.compute_dtype, offload=self.param_offload)

    def _autocast(self) -> bool:
        return False  # the MixedPrecisionPolicy casts

    def _offload(self, to_host: bool) -> None:
        pass  # CPUOffloadPolicy: the shards stay in host memory, each unshard copies to the device

    def _reduce(self, values: list[float], op: dist.ReduceOp) -> list[float]:
        return all_reduce_values(values, self.device, op)

    def _sum_across_ranks(self, values: list[float]) -> list[float]:
        """Σ over the data: over all ranks, each SP group's (identical) values counted once."""
        if not values:
            return values
        return [v / self.sp_size for v in self._reduce(values, dist.ReduceOp.SUM)]

    def _max_across_ranks(self, value: int) -> int:
        return int(self._reduce([float(value)], dist.ReduceOp.MAX)[0])

    def _grad_scale(self) -> float:
        return float(self._world)

    def _set_grad_sync(self, enabled: bool) -> None:
        """Every micro-batch's backward reduce-scatters (verl's FSDP2 actor does the same): the rank accumulates
        its fp32 gradient shards, P·4/W bytes. Skipping the sync before the last micro-batch
        (`set_requires_gradient_sync(False)`) would keep each parameter's unsharded gradient, upcast to the fp32
        reduce dtype, until then: P·4 bytes on every rank (Qwen3-VL-8B: 35 GB of a 64 GB NPU), for one
        reduce-scatter per update instead of one per micro-batch."""

    def _local_params(self) -> list[torch.Tensor]:
        return [p.to_local().detach() if isinstance(p, DTensor) else p.detach() for p in self.model.parameters()]

    def _barrier(self) -> None:
        dist.barrier()

    def save(self, path: str) -> None:
        """Every rank writes its shards (`torch_weights.save_sharded`: torch distributed checkpoint, no gather)."""
        torch_weights.save_sharded(self, path)

    def export_weights(self, bucket_bytes: int):  # noqa: ANN201 — an iterator of buckets, as the base class
        """Gathered per tensor on the device in the export dtype (`torch_weights.export_sharded`)."""
        return torch_weights.export_sharded(self, bucket_bytes)

    def _state_dict_options(self, loading: bool = False) -> StateDictOptions:
        if loading:
            return StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        return StateDictOptions(full_state_dict=True, cpu_offload=True)
