"""Process groups for the Megatron backend: torch.distributed (gloo on CPU, nccl on GPU) and Megatron's
model-parallel groups.

World layout (Megatron's): world = TP × CP × PP × DP for the dense layers, and ETP × EP × EDP × PP over the
same ranks for the expert layers (ETP = expert tensor parallel, verl's `etp`, default 1; Megatron 0.16's
rule: ETP × EP must divide TP × CP × DP, the expert-data-parallel size is TP × CP × DP / (ETP × EP)). TP, PP, EP and DP run on CPU
(gloo) and GPU; context parallelism needs Transformer Engine's attention, hence CUDA
(`context_parallel.py`), so CP > 1 on CPU is rejected up front with a clear error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch.distributed as dist

from engine.plan.devices import COLLECTIVE_BACKEND, PROCESS_GROUP_TIMEOUT_S
from engine.trainer import process_groups as groups


class ParallelConfigError(ValueError):
    """The requested parallel layout is invalid or not available on this device."""


@dataclass(frozen=True)
class ParallelLayout:
    """Sizes of each parallel dimension; `dp` is derived from the world size."""

    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    world_size: int = 1
    etp: int = 1
    first_stage_layers: int | None = None
    """Megatron's `num_layers_in_first_pipeline_stage` (None: the even split, `engine.config.megatron_model`)."""
    last_stage_layers: int | None = None
    """Megatron's `num_layers_in_last_pipeline_stage`."""

    def stage_layers(self, num_layers: int) -> tuple[int, ...]:
        """Decoder layers per pipeline stage (`engine.config.megatron_model.stage_layers`)."""
        from engine.config.megatron_model import stage_layers

        return stage_layers(num_layers, self.pp, self.first_stage_layers, self.last_stage_layers)

    @property
    def dp(self) -> int:
        return self.world_size // (self.tp * self.pp * self.cp)

    def validate(self, *, on_gpu: bool, num_experts: int = 0, num_layers: int = 0,
                 num_query_groups: int = 0) -> None:
        """Raise `ParallelConfigError` if this layout cannot run (here, or at all)."""
        for name in ("tp", "pp", "cp", "ep", "etp", "world_size"):
            if getattr(self, name) < 1:
                raise ParallelConfigError(f"{name} must be >= 1")
        if self.world_size % (self.tp * self.pp * self.cp):
            raise ParallelConfigError(
                f"world_size {self.world_size} is not divisible by tp×pp×cp = {self.tp * self.pp * self.cp}")
        from engine.trainer.megatron.context_parallel import require_cp_support

        require_cp_support(self.cp, self.pp, on_gpu)
        if (self.tp * self.cp * self.dp) % (self.etp * self.ep):
            raise ParallelConfigError(f"etp×ep = {self.etp}×{self.ep} must divide tp×cp×dp = "
                                      f"{self.tp * self.cp * self.dp}")
        if self.ep > 1 and not num_experts:
            raise ParallelConfigError("ep > 1 needs a mixture-of-experts model")
        if num_experts and num_experts % self.ep:
            raise ParallelConfigError(f"num_experts {num_experts} is not divisible by ep {self.ep}")
        if num_query_groups and num_query_groups % self.tp:
            raise ParallelConfigError(f"num_key_value_heads {num_query_groups} is not divisible by tp {self.tp}")
        if num_layers:
            try:
                self.stage_layers(num_layers)
            except ValueError as e:
                raise ParallelConfigError(str(e)) from None


def init_process_group(rank: int, world_size: int, master_addr: str, master_port: int, device: str = "cpu") -> None:
    """Initialise torch.distributed once per process (a no-op when already initialised with this world): the
    device's backend from the one table (`COLLECTIVE_BACKEND`: gloo on CPU, NCCL on CUDA), rank r on CUDA device
    r mod count, collectives giving up after `PROCESS_GROUP_TIMEOUT_S`."""
    if dist.is_initialized():
        if dist.get_world_size() != world_size or dist.get_rank() != rank:
            raise ParallelConfigError(
                f"torch.distributed is already initialised as rank {dist.get_rank()}/{dist.get_world_size()}, "
                f"not {rank}/{world_size}")
        return
    groups.init_process_group(rank, world_size, f"tcp://{master_addr}:{master_port}", device,
                              backend=COLLECTIVE_BACKEND[device])


STAGE_SPLIT: list[int | None] = [None, None]
"""The (first, last) stage layer counts of the layout `init_model_parallel` built last: Megatron's parallel state
holds no layer split, and the HF ↔ Megatron rules of a stage need it (`export.current_shard_info`)."""


def init_model_parallel(layout: ParallelLayout, gloo_groups: bool = True) -> None:
    """Create Megatron's TP/PP/CP/EP/DP groups for `layout`, reusing them if they already match. `gloo_groups`:
    Megatron's gloo copies of the DP groups too (its CPU-side optimizer-state gather needs them; torch's fake
    process group, on which `asyncrl rehearse` builds the groups, cannot make gloo ones)."""
    from megatron.core import parallel_state as ps

    STAGE_SPLIT[:] = [layout.first_stage_layers, layout.last_stage_layers]
    if ps.model_parallel_is_initialized():
        current = (ps.get_tensor_model_parallel_world_size(), ps.get_pipeline_model_parallel_world_size(),
                   ps.get_context_parallel_world_size(), ps.get_expert_model_parallel_world_size(),
                   ps.get_expert_tensor_parallel_world_size())
        if current == (layout.tp, layout.pp, layout.cp, layout.ep, layout.etp):
            return
        ps.destroy_model_parallel()
    ps.initialize_model_parallel(
        distributed_timeout_minutes=max(1, math.ceil(PROCESS_GROUP_TIMEOUT_S / 60)),  # Megatron's default: 30
        tensor_model_parallel_size=layout.tp,
        pipeline_model_parallel_size=layout.pp,
        context_parallel_size=layout.cp,
        expert_model_parallel_size=layout.ep,
        expert_tensor_parallel_size=layout.etp,
        create_gloo_process_groups=gloo_groups,
    )
