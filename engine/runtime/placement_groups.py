"""Ray placement groups for the trainer and rollout pools (accelerator hardware).

`engine.plan.layout` says, for each pool, how many bundles each node reserves and which node and
bundles every actor takes; this module turns that into Ray: one placement group per pool node, one bundle
per accelerator (`{GPU: 1, CPU: 1}` on CUDA, `{NPU: 1, CPU: 1}` on Ascend), strategy `STRICT_PACK` so the
node's bundles share one machine — a TP group or a replica's t bundles never span nodes. `reserve` waits at
most `timeout_s` for all of them and otherwise fails with one line naming the first group that could not be
placed (instead of Ray's silent wait forever), after removing what it had reserved.

An actor of one accelerator (a trainer rank, a TP-1 replica) asks for that accelerator inside its bundle. A
replica of tensor parallelism t > 1 is scheduled on its first bundle with no accelerator of its own, and
`VLLM_RAY_BUNDLE_INDICES` names its t bundles: vLLM's Ray executor (inside the replica's placement group,
child tasks captured) starts one GPU worker per bundle there, as verl does.

CPU hardware reserves nothing (one machine), except for vLLM replicas that span nodes (`reserve_spanning`: one
STRICT_SPREAD group of one-CPU bundles per replica, one bundle per node; `engine.runtime.replica_nodes`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from engine.plan.layout import PoolLayout
from engine.plan.placement import RAY_ACCELERATOR, accelerators

log = logging.getLogger(__name__)


class PlacementTimeout(RuntimeError):
    """A pool could not be placed in time (message: one line naming it)."""


def bundle(device: str) -> dict[str, float]:
    """One accelerator's bundle: the accelerator and one CPU for the actor's process."""
    return {RAY_ACCELERATOR[device]: 1, "CPU": 1}


@dataclass
class Pools:
    """The reserved placement groups: pool name → one group per node of that pool's layout."""

    device: str
    layouts: dict[str, PoolLayout]
    groups: dict[str, list[Any]] = field(default_factory=dict)

    def actor_options(self, pool: str, index: int, base: dict[str, Any] | None = None) -> dict[str, Any]:
        """Ray actor options placing actor `index` of `pool` on its node's bundles (module docstring)."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        slot = self.layouts[pool].slots[index]
        opts = {k: v for k, v in (base or {}).items() if k not in ("num_gpus", "resources")}
        opts["num_cpus"] = 1
        env = dict(opts.get("runtime_env", {}).get("env_vars", {}))
        if len(slot.bundles) == 1:
            opts.update(accelerators(self.device, 1))
        else:
            opts["num_gpus"] = 0
            env["VLLM_RAY_BUNDLE_INDICES"] = ",".join(map(str, slot.bundles))
        if env:
            opts["runtime_env"] = {**opts.get("runtime_env", {}), "env_vars": env}
        opts["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
            placement_group=self.groups[pool][slot.node], placement_group_bundle_index=slot.bundles[0],
            placement_group_capture_child_tasks=True)
        return opts

    def all_options(self, pool: str, base: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        return [self.actor_options(pool, i, base) for i in range(len(self.layouts[pool].slots))]

    def release(self) -> None:
        """Remove every placement group (the actors in them must be gone or going)."""
        from ray.util import remove_placement_group

        for groups in self.groups.values():
            for pg in groups:
                try:
                    remove_placement_group(pg)
                except Exception as e:  # noqa: BLE001 — best effort on the way out: never mask the real error
                    log.debug("placement group not removed: %s", e)
        self.groups = {}


def reserve(device: str, layouts: dict[str, PoolLayout], timeout_s: float, run_name: str = "asyncrl") -> Pools:
    """Create one STRICT_PACK placement group per pool node and wait for all of them (at most `timeout_s`).
    Raises `PlacementTimeout` naming the first group that is not placed."""
    import ray
    from ray.util import placement_group

    pools = Pools(device, layouts)
    pending: dict[Any, str] = {}
    for name, layout in layouts.items():
        pools.groups[name] = []
        for n, count in enumerate(layout.node_bundles):
            pg = placement_group([bundle(device) for _ in range(count)], strategy="STRICT_PACK",
                                 name=f"{run_name}:{name}-node-{n}")
            pools.groups[name].append(pg)
            pending[pg.ready()] = f"{name} node {n} ({count} bundles of {bundle(device)})"
    deadline = time.monotonic() + timeout_s
    waiting = list(pending)
    while waiting:
        _, waiting = ray.wait(waiting, num_returns=len(waiting), timeout=max(0.0, deadline - time.monotonic()))
        if waiting and time.monotonic() >= deadline:
            missing = [pending[r] for r in waiting]
            free = {k: v for k, v in ray.available_resources().items() if k in ("CPU", RAY_ACCELERATOR[device])}
            pools.release()
            more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
            raise PlacementTimeout(f"could not place the {missing[0]}{more} within {timeout_s:g} s: each node "
                                   f"group needs one node with that many free; the cluster has {free} free "
                                   "(`ray status`), so add nodes or lower resources.*")
    return pools


def reserve_spanning(replicas: int, nodes: int, timeout_s: float, run_name: str = "asyncrl") -> Pools:
    """CPU hardware with rollout replicas over several nodes (`engine.runtime.replica_nodes`): one placement group per
    replica of `nodes` one-CPU bundles, STRICT_SPREAD (each bundle on another node), under pool "rollout". Waits at
    most `timeout_s`; raises `PlacementTimeout` naming the replica whose group was not placed."""
    import ray
    from ray.util import placement_group

    pools = Pools("cpu", {})
    pools.groups["rollout"] = [placement_group([{"CPU": 1} for _ in range(nodes)], strategy="STRICT_SPREAD",
                                               name=f"{run_name}:rollout-replica-{i}") for i in range(replicas)]
    refs = {pg.ready(): i for i, pg in enumerate(pools.groups["rollout"])}
    _, waiting = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
    if waiting:
        alive = sum(1 for n in ray.nodes() if n["Alive"])
        pools.release()
        raise PlacementTimeout(f"could not place rollout replica {refs[waiting[0]]} over {nodes} nodes (one CPU on "
                               f"each) within {timeout_s:g} s: the Ray cluster has {alive} node(s) (`ray status`); "
                               f"join {nodes} nodes, or set resources.rollout.gpus_per_node to the replica's "
                               "tensor_parallel_size")
    return pools


def spanning_options(pools: Pools, base: dict[str, Any]) -> list[dict[str, Any]]:
    """Each replica's Ray options on bundle 0 of its own group (`reserve_spanning`); it starts its other node ranks
    on the other bundles itself."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    opts = {k: v for k, v in base.items() if k not in ("num_gpus", "resources")}
    return [{**opts, "num_cpus": 1, "scheduling_strategy": PlacementGroupSchedulingStrategy(
        placement_group=pg, placement_group_bundle_index=0)} for pg in pools.groups["rollout"]]


def reserve_run(placement: dict[str, Any], run_name: str) -> Pools | None:
    """The driver's reservation: `reserve` the pools of `placement["layouts"]` and put every actor's options
    (`replica_options`, `trainer_options`: its node's group and bundle) into `placement`. On CPU hardware (no
    layouts: one machine) nothing, unless the replicas span nodes (`placement["replica_nodes"]`): then one group per
    replica (`reserve_spanning`). Raises `PlacementTimeout`."""
    if "replica_nodes" in placement:
        pools = reserve_spanning(placement["replicas"], placement["replica_nodes"], placement["placement_timeout_s"],
                                 run_name)
        placement["replica_options"] = spanning_options(pools, placement["replica_res"])
        return pools
    if "layouts" not in placement:
        return None
    pools = reserve(placement["device"], placement["layouts"], placement["placement_timeout_s"], run_name)
    placement["replica_options"] = pools.all_options("rollout", placement["replica_res"])
    placement["trainer_options"] = pools.all_options("trainer", placement["trainer_res"])
    return pools
