"""Devices of a run: where each role computes, how a process finds its accelerator, how its ranks talk.

The run plan resolves this once from the hardware preset (`RunPlan.devices`) and hands each actor its
`RoleDevice`; no backend probes `torch.cuda` or re-reads the hardware TOML. One table per fact:

    COLLECTIVE_BACKEND   device → torch.distributed backend of its device tensors (gloo / nccl / hccl)
    VISIBLE_DEVICES_ENV  device → the variable naming a process's accelerators (Ray sets it per actor)
    RAY_NOSET_ENV        device → Ray's documented override that leaves that variable alone
    REDUCE_DTYPES        backend → the dtypes `all_reduce` sums in, best first (HCCL has no float64 reduction)

Process groups. A trainer group is created as `process_group_backend(device)`: `"gloo"` on CPU, else
`"cpu:gloo,<device>:<backend>"` (verl's form) — one group whose CPU tensors go over gloo and whose device tensors
go over NCCL / HCCL, so CPU metadata never reaches an accelerator-only backend. A scalar reduction
(`reduction(device, group_backend)`) still puts its tensor on the accelerator whenever the group has the
accelerator's backend, and sums in float64 only where that backend reduces float64.

Index policy. `"ray"`: Ray gave the actor exactly its accelerator (`num_gpus=1` / `{NPU: 1}`) and narrowed the
visible-devices variable to it, so the device is index 0 inside the process. `"local_rank"`: the process sees every
accelerator of its node (visible-devices left alone), so rank r takes index r mod count. `"bundles"`: a vLLM
replica with tensor parallelism t > 1 holds no accelerator itself; its runtime env sets `RAY_NOSET_ENV`, so Ray
does not blank the visible devices of that GPU-less actor (Ray ≥ 2.40 sets them to "" for `num_gpus=0`), and
vLLM's Ray executor gives each of its t workers its bundle's device.

Pure Python (no torch, no Ray): the plan, the CLI and the tests import it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from engine.config.schema import RunConfig

DeviceType = Literal["cuda", "npu", "cpu"]
IndexPolicy = Literal["ray", "local_rank", "bundles", "none"]

COLLECTIVE_BACKEND: dict[str, str] = {"cpu": "gloo", "cuda": "nccl", "npu": "hccl"}
"""torch.distributed backend of each device's tensors (the one device → backend table)."""

WEIGHT_SYNC_TRANSPORTS: dict[str, tuple[str, ...]] = {
    "cpu": ("collective", "shared_memory", "object_store"),
    "cuda": ("collective", "object_store"),
    "npu": ("collective", "object_store"),
}
"""The weight-sync transports that exist on each trainer device (`engine.sync.runtime.weight_transport` builds
them: the collective over the device's `COLLECTIVE_BACKEND` — gloo, NCCL, HCCL —, shared memory on the host)."""


def weight_sync_transport(cfg: RunConfig, device: str) -> str:
    """The transport `rollout.weight_sync` resolves to on `device` (the run plan shows it; the trainer builds it):
    an explicit choice as is; `"auto"` → `"shared_memory"` when the weights live on the host (`cpu`), the
    replicas are `hf` samplers and every pool is on one node (the trainer's host: Ray places a one-node CPU run
    there), else `"collective"`. ValueError (one line) for a choice the run cannot use."""
    r = cfg.rollout
    if r.weight_sync_back_buffer == "on" and r.backend != "hf":
        raise ValueError('rollout.weight_sync_back_buffer = "on" needs rollout.backend = "hf" (vLLM replicas load '
                         'in place); use "auto" or "off"')
    choice = r.weight_sync
    one_host = cfg.resources.trainer.nnodes == 1 and cfg.resources.rollout.nnodes == 1
    if choice == "auto":
        choice = "shared_memory" if device == "cpu" and r.backend == "hf" and one_host else "collective"
    if choice == "shared_memory" and (device != "cpu" or r.backend != "hf" or not one_host):
        raise ValueError('rollout.weight_sync = "shared_memory" needs device cpu, rollout.backend = "hf" and one '
                         f'node for both pools (here: {device}, {r.backend}, trainer.nnodes = '
                         f'{cfg.resources.trainer.nnodes}, rollout.nnodes = {cfg.resources.rollout.nnodes}); use '
                         '"auto" or "collective"')
    if choice not in WEIGHT_SYNC_TRANSPORTS.get(device, ()):
        raise ValueError(f'rollout.weight_sync = "{choice}" has no transport on {device!r} (there: '
                         f'{", ".join(WEIGHT_SYNC_TRANSPORTS.get(device, ())) or "none"})')
    return choice


VISIBLE_DEVICES_ENV: dict[str, str] = {"cuda": "CUDA_VISIBLE_DEVICES", "npu": "ASCEND_RT_VISIBLE_DEVICES"}
"""The variable that names the accelerators a process may use."""

RAY_NOSET_ENV: dict[str, str] = {"cuda": "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES",
                                 "npu": "RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES"}
"""Ray's override: with it set in an actor's environment, Ray leaves `VISIBLE_DEVICES_ENV` as it found it."""

REDUCE_DTYPES: dict[str, tuple[str, ...]] = {"gloo": ("float64", "float32"), "nccl": ("float64", "float32"),
                                             "hccl": ("float32",), "fake": ("float64", "float32")}
"""The float dtypes each backend's `all_reduce` supports, best first (HCCL reduces no float64; `"fake"` is
torch's data-less process group, on which `asyncrl rehearse` builds the trainer ranks)."""

PROCESS_GROUP_TIMEOUT_S = 300.0
"""How long a rank waits inside a collective for a dead peer before it gives up (the trainer group, Megatron's
sub-groups and the collective weight sync alike)."""

COLLECTIVE_ENV_PREFIXES = ("NCCL_", "HCCL_", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME")
"""The launching shell's variables that configure collectives; they travel to every trainer rank and replica."""


@dataclass(frozen=True)
class RoleDevice:
    """Where one role (the trainer ranks or the rollout replicas) computes."""

    type: DeviceType
    index_policy: IndexPolicy = "ray"
    env: Mapping[str, str] = field(default_factory=dict)
    """Collective settings (`NCCL_*`, `HCCL_*`, `GLOO_SOCKET_IFNAME`) the role's processes get."""

    @property
    def backend(self) -> str:
        """The collective backend of this device's tensors."""
        return COLLECTIVE_BACKEND[self.type]

    @property
    def accelerator(self) -> bool:
        return self.type != "cpu"

    def process_group_backend(self) -> str:
        """The `backend` argument of `init_process_group` (module docstring)."""
        return process_group_backend(self.type)

    def index(self, rank: int, visible: int) -> int | None:
        """The accelerator index this process uses (None on CPU); `visible`: accelerators it sees."""
        if not self.accelerator:
            return None
        if self.index_policy == "local_rank":
            return rank % max(1, visible)
        return 0

    def torch_device(self, rank: int = 0, visible: int = 1) -> str:
        """`"cpu"`, `"cuda:0"`, `"npu:3"`: the torch device string of this process."""
        i = self.index(rank, visible)
        return self.type if i is None else f"{self.type}:{i}"


def process_group_backend(device: str) -> str:
    """`gloo` on CPU; `cpu:gloo,cuda:nccl` / `cpu:gloo,npu:hccl` on accelerators (a gloo side for CPU tensors)."""
    backend = COLLECTIVE_BACKEND[device]
    return backend if device == "cpu" else f"cpu:gloo,{device}:{backend}"


def group_backends(spec: str) -> dict[str, str]:
    """`"cpu:gloo,cuda:nccl"` → `{"cpu": "gloo", "cuda": "nccl"}`; a bare backend name serves the devices the
    table gives it (`"gloo"` → cpu, `"nccl"` → cuda, `"hccl"` → npu)."""
    if ":" not in spec:
        return {d: b for d, b in COLLECTIVE_BACKEND.items() if b == spec.lower()}
    return dict(part.split(":", 1) for part in spec.lower().split(","))


def reduction(device: str, group_backend: str) -> tuple[str, str]:
    """(tensor device type, dtype) of a scalar all_reduce on a group created as `group_backend` by a rank computing
    on `device`: the accelerator when the group has its backend (an accelerator-only group never gets a CPU
    tensor), else the CPU when the group has a gloo side; the best dtype that backend reduces."""
    served = group_backends(group_backend)
    if device in served:
        where = device
    elif "cpu" in served:
        where = "cpu"
    else:
        raise ValueError(f"a {group_backend!r} process group serves neither {device!r} nor CPU tensors")
    return where, REDUCE_DTYPES[served[where]][0]


def collective_env(preset_env: Mapping[str, str], config_env: Mapping[str, str],
                   environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The collective settings of every trainer rank and replica: the hardware preset's defaults, then the launching
    shell's `NCCL_*` / `HCCL_*` / `GLOO_SOCKET_IFNAME` variables, then `resources.collective_env` (later wins)."""
    environ = os.environ if environ is None else environ
    shell = {k: v for k, v in environ.items() if k.startswith(COLLECTIVE_ENV_PREFIXES)}
    return {**dict(preset_env), **shell, **dict(config_env)}


def role_devices(device: str, tensor_parallel_size: int, env: Mapping[str, str] | None = None) -> dict[str, RoleDevice]:
    """`{"trainer": …, "rollout": …}` on hardware of `device`: each trainer rank and one-worker replica holds one
    accelerator (`"ray"`); a replica of `tensor_parallel_size` > 1 workers (its TP × PP × DP) spreads over its
    bundles (`"bundles"`)."""
    env = dict(env or {})
    if device == "cpu":
        cpu = RoleDevice("cpu", "none", env)
        return {"trainer": cpu, "rollout": cpu}
    rollout_policy: IndexPolicy = "bundles" if tensor_parallel_size > 1 else "ray"
    return {"trainer": RoleDevice(device, "ray", env),  # type: ignore[arg-type]
            "rollout": RoleDevice(device, rollout_policy, env)}  # type: ignore[arg-type]


def actor_env(role: RoleDevice) -> dict[str, str]:
    """The runtime-env variables of an actor of `role`: its collective settings, and Ray's no-set override when
    the actor holds no accelerator of its own but its children do (`"bundles"`)."""
    env = dict(role.env)
    if role.index_policy == "bundles" and role.type in RAY_NOSET_ENV:
        env[RAY_NOSET_ENV[role.type]] = "1"
    return env
