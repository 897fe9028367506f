"""Process groups of trainer ranks, per device (`engine.plan.devices` holds the tables and the pure rules).

    init_process_group   joins the default group as `process_group_backend(device)` — gloo on CPU,
                         `cpu:gloo,cuda:nccl` / `cpu:gloo,npu:hccl` on accelerators — after `set_device`, within
                         `PROCESS_GROUP_TIMEOUT_S` (a rank inside a collective with a dead peer gives up then)
    set_device           CUDA and NPU: the index of the role's policy (`RoleDevice.index`)
    all_reduce_values    a list of floats summed / maxed over the group on the device and in the dtype that
                         `reduction(device, group backend)` picks: never a CPU tensor on an accelerator-only group,
                         never float64 where the backend has no float64 reduction (HCCL)
    checkpoint_group     a gloo group of every rank whose timeout (`CHECKPOINT_TIMEOUT_S`) covers a checkpoint
                         write: the barriers around a save and the sharded save's own collectives wait on it, not
                         on the device group's `PROCESS_GROUP_TIMEOUT_S` (a rank-0 write of a large model's state
                         takes minutes while the others wait)
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist

from engine.plan.devices import PROCESS_GROUP_TIMEOUT_S, RoleDevice, group_backends, process_group_backend, reduction


def as_role(device: RoleDevice | str | None, backend: str | None = None) -> RoleDevice:
    """A `RoleDevice` from a role, a device name, or (neither) the device a bare `backend` name serves; a rank that
    sees every accelerator of its node takes index rank mod count (`"local_rank"`)."""
    if isinstance(device, RoleDevice):
        return device
    if device is None:
        served = [d for d in group_backends(backend or "gloo") if d != "cpu"]
        device = served[0] if served else "cpu"
    return RoleDevice(device, "local_rank" if device != "cpu" else "none")  # type: ignore[arg-type]


def _accelerator_module(kind: str):
    if kind == "npu":
        import torch_npu  # noqa: F401 — registers torch.npu

    return getattr(torch, kind)


def set_device(role: RoleDevice, rank: int) -> torch.device:
    """Make this process's accelerator current (CUDA and NPU alike); the torch device it computes on."""
    if not role.accelerator:
        return torch.device("cpu")
    module = _accelerator_module(role.type)
    index = role.index(rank, module.device_count())
    module.set_device(index)
    return torch.device(role.type, index)


def init_process_group(rank: int, world_size: int, init_method: str | None, device: RoleDevice | str | None = None,
                       backend: str | None = None, timeout_s: float = PROCESS_GROUP_TIMEOUT_S) -> None:
    """Join the default process group: `backend` when given (tests), else `process_group_backend(device)`.
    Rank 0 of a TCP rendezvous (`tcp://addr:port`, or env:// from MASTER_ADDR / MASTER_PORT) hosts the store
    itself, listening on `addr` only (`engine.sync.store.host_store`; torch's own would listen on every
    interface), under the prefix torch's rendezvous gives it, so the other ranks join it unchanged."""
    role = as_role(device, backend)
    set_device(role, rank)
    store, where = None, _tcp_rendezvous(init_method) if rank == 0 else None
    if where is not None:
        from engine.sync.store import host_store

        store, init_method = dist.PrefixStore("default_pg", host_store(*where, world_size, timeout_s)), None
    dist.init_process_group(backend or process_group_backend(role.type), init_method=init_method, rank=rank,
                            world_size=world_size, timeout=timedelta(seconds=timeout_s), store=store)


def _tcp_rendezvous(init_method: str | None) -> tuple[str, int] | None:
    """(addr, port) of a `tcp://` or env:// rendezvous; None for any other (e.g. `file://`)."""
    if init_method is None or init_method == "env://":
        addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
        return (addr, int(port)) if addr and port else None
    if init_method.startswith("tcp://"):
        addr, _, port = init_method.removeprefix("tcp://").split("?")[0].rpartition(":")
        return addr.strip("[]"), int(port)
    return None


def group_backend(group: dist.ProcessGroup | None = None) -> str:
    """The group's backend as `device:backend` pairs (`"cpu:gloo,cuda:nccl"`), or its bare name on old torch."""
    config = getattr(dist, "get_backend_config", None)
    return str(config(group)) if config is not None else str(dist.get_backend(group))


def reduce_dtype(device: str, group: dist.ProcessGroup | None = None) -> torch.dtype:
    """The dtype a reduction of a `device` tensor over `group` should use (float64 where supported)."""
    return getattr(torch, reduction(device, group_backend(group))[1])


def all_reduce_values(values: list[float], device: torch.device, op: dist.ReduceOp = dist.ReduceOp.SUM,
                      group: dist.ProcessGroup | None = None) -> list[float]:
    """`values` reduced over `group` by a rank computing on `device` (module docstring)."""
    where, dtype = reduction(device.type, group_backend(group))
    t = torch.tensor(values, dtype=getattr(torch, dtype), device=device if where == device.type else where)
    dist.all_reduce(t, op=op, group=group)
    return t.tolist()


def rendezvous(master_addr: str, master_port: int) -> str:
    """`tcp://addr:port`, also exported as MASTER_ADDR / MASTER_PORT (libraries that read them)."""
    os.environ["MASTER_ADDR"] = master_addr
    os.environ["MASTER_PORT"] = str(master_port)
    return f"tcp://{master_addr}:{master_port}"


CHECKPOINT_TIMEOUT_S = 3600.0
"""How long a rank waits at a checkpoint barrier for the others to finish writing."""

_CHECKPOINT_GROUPS: dict[int, object] = {}


def checkpoint_group() -> object | None:
    """The checkpoint group of the current default group (module docstring); None without a group of several
    ranks. Created on first use: every rank calls it at the same point (a save is collective)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return None
    world = id(dist.distributed_c10d._get_default_group())
    group = _CHECKPOINT_GROUPS.get(world)
    if group is None:
        _CHECKPOINT_GROUPS.clear()  # a destroyed default group's: never used again
        group = dist.new_group(backend="gloo", timeout=timedelta(seconds=CHECKPOINT_TIMEOUT_S))
        _CHECKPOINT_GROUPS[world] = group
    return group


def checkpoint_barrier() -> None:
    """A barrier of every rank on `checkpoint_group` (nothing for one rank)."""
    group = checkpoint_group()
    if group is not None:
        dist.barrier(group=group)
