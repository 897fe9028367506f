"""The placement of a run: which actors, how many accelerators each, on which nodes, and what each asks Ray for.

Trainer and rollout pools are disjoint (verl fully async). The trainer is M = `trainer_world` ranks, one per
GPU; the rollout is R = `rollout_replicas` engines of `tensor_parallel_size` GPUs each, packed node by node (a
replica never spans nodes). Controller, message queue and rollouter are CPU actors on the head node.

`plan_placement` is the layout `launch --dry-run` prints (which node and bundles each actor takes comes from
`engine.plan.layout`, the formula the driver reserves Ray placement groups with); `actor_resources` is what
the driver asks Ray for.
Both count M and R with the same functions (`engine.plan.sizes`).

CPU cores (`device = "cpu"`, C = the cores): in sync mode the phases alternate, so the replicas get C threads
and each trainer rank C // M; fully async splits them, never oversubscribed: each replica (C // 2) // R, each
trainer rank (C − R·replica_threads) // M, at least 1; `resources.{trainer,rollout}.cpu_threads` overrides it
(0 = this split, "all" = C, "auto" = this split here, C or this split once the launch has measured:
`engine.plan.auto`).
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from engine.plan.devices import RoleDevice, actor_env
from engine.plan.layout import LayoutError, PoolLayout, config_layout, describe_slots
from engine.plan.sizes import Derived, rollout_replicas, trainer_world

if TYPE_CHECKING:
    from engine.config.schema import RunConfig

RAY_ACCELERATOR = {"cuda": "GPU", "npu": "NPU"}
"""Ray's resource name per accelerator device: GPUs are `num_gpus`, Ascend NPUs the custom resource "NPU"
(Ray detects them and sets `ASCEND_RT_VISIBLE_DEVICES` per actor)."""


@dataclass(frozen=True)
class ActorGroup:
    """Actors of one kind: count, accelerators per actor, and where they go."""

    name: str
    count: int
    gpus_per_actor: int
    nodes: list[str] = field(default_factory=list)
    layout: str = ""


@dataclass(frozen=True)
class Placement:
    """The whole plan."""

    device: str
    nodes: dict[str, int]
    """Node label → accelerators used on it."""
    actors: list[ActorGroup]
    pools: dict[str, PoolLayout] = field(default_factory=dict)
    """The placement groups: per pool, bundles per node and each actor's node and bundles."""

    def node_rows(self) -> list[tuple[str, int, str]]:
        """(node label, bundles reserved, what the actors there take) for every reserved node."""
        rows = []
        for name, pool in self.pools.items():
            for n, bundles in enumerate(pool.node_bundles):
                rows.append((f"{name}-node-{n}", bundles, describe_slots(pool, n)))
        return rows

    @property
    def total_gpus(self) -> int:
        """Accelerators the run uses."""
        return sum(self.nodes.values())

    def to_json(self) -> dict[str, Any]:
        """A plain dict for JSON output."""
        return {
            "device": self.device,
            "nodes": self.nodes,
            "total_gpus": self.total_gpus,
            "actors": [asdict(a) for a in self.actors],
            "placement_groups": {name: pool.to_json() for name, pool in self.pools.items()},
        }


def plan_placement(cfg: RunConfig, d: Derived, device: str | None) -> Placement:
    """Lay the trainer and rollout pools out over their nodes (`device` None: the hardware is unknown)."""
    res, t, r = cfg.resources, cfg.trainer, cfg.rollout
    from engine.plan.rollout_replica import describe, replica_gpus

    tp = replica_gpus(cfg)
    try:
        pools = config_layout(cfg, d.rollout_replicas)
    except LayoutError:  # `validate` reports the layout problem with its key; show the pools as asked
        pools = {}
    nodes: dict[str, int] = {}
    if pools:
        for name, pool in pools.items():
            for n, bundles in enumerate(pool.node_bundles):
                nodes[f"{name}-node-{n}"] = bundles
        trainer_nodes = [f"trainer-node-{n}" for n in range(pools["trainer"].nnodes)]
        replica_nodes = [f"rollout-node-{s.node}" for s in pools["rollout"].slots]
    else:
        trainer_nodes = [f"trainer-node-{i}" for i in range(res.trainer.nnodes)]
        for n in trainer_nodes:
            nodes[n] = res.trainer.gpus_per_node
        replica_nodes = []
    if t.backend == "megatron":
        layout = f"megatron tp{t.tp} × pp{t.pp} × cp{t.cp} × dp{d.trainer_dp} (ep{t.ep})"
    else:
        layout = f"torch FSDP2 dp{d.trainer_dp}"
    actors = [
        ActorGroup("RunController", 1, 0, ["head"], "metrics, events, knobs"),
        ActorGroup("MessageQueue", 1, 0, ["head"], f"bounded at {d.max_queue_size} prompt groups"),
        ActorGroup("Rollouter", 1, 0, ["head"], f"admits ≤ {d.max_required_samples} prompts per version"),
        ActorGroup(
            "RolloutReplica", d.rollout_replicas, tp, sorted(set(replica_nodes), key=_node_order),
            f"{r.backend} {describe(cfg, res.rollout.gpus_per_node)}" if r.backend == "vllm" else f"{r.backend} tp{tp}"
        ),
        ActorGroup("TrainerWorker", d.trainer_world, 1, trainer_nodes, layout),
    ]
    return Placement(device or "unknown", nodes, actors, pools)


def _node_order(label: str) -> int:
    return int(label.rsplit("-", 1)[1])


def accelerators(device: str, count: int) -> dict[str, Any]:
    """The actor options that ask Ray for `count` accelerators of `device`."""
    if device == "cuda":
        return {"num_gpus": count}
    return {"resources": {RAY_ACCELERATOR[device]: count}}


def resolve_threads(setting: int | str, automatic: int, cores: int) -> int:
    """A pool's `cpu_threads` setting resolved: 0 → `automatic`, "all" → every core, "auto" → `automatic` until
    the launch measures (`engine.launch.probe`), else the number given."""
    if setting == "all":
        return cores
    if setting == "auto":
        return automatic
    return int(setting) or automatic


def actor_resources(cfg: RunConfig, device: str, cores: int,
                    devices: dict[str, RoleDevice] | None = None) -> dict[str, Any]:
    """How many replicas and trainer ranks, and what each actor asks Ray for (`trainer_res` and
    `trainer_threads` are per trainer rank); `cores` counts this machine's CPUs (used on `device = "cpu"`).
    `devices` (`RunPlan.devices`): each role's runtime env gets its collective settings (`actor_env`)."""
    res = _actor_resources(cfg, device, cores)
    for role, key in (("rollout", "replica_res"), ("trainer", "trainer_res")):
        env = actor_env(devices[role]) if devices else {}
        if env:
            runtime_env = res[key].setdefault("runtime_env", {})
            runtime_env["env_vars"] = {**runtime_env.get("env_vars", {}), **env}
    return res


def _actor_resources(cfg: RunConfig, device: str, cores: int) -> dict[str, Any]:
    replicas, ranks = rollout_replicas(cfg), trainer_world(cfg)
    if device == "cpu":
        if cfg.async_training.mode == "sync":  # the phases alternate, so each may use every core
            replica_threads, trainer_threads = cores, max(1, cores // ranks)
        else:
            # Fully async: the trainer and the replicas compute at the same time, so by default the cores are
            # split, never oversubscribed (the replicas share half, the trainer ranks the rest).
            replica_threads = max(1, (cores // 2) // replicas)
            trainer_threads = max(1, (cores - replica_threads * replicas) // ranks)
        replica_threads = resolve_threads(cfg.resources.rollout.cpu_threads, replica_threads, cores)
        trainer_threads = resolve_threads(cfg.resources.trainer.cpu_threads, trainer_threads, cores)
        res: dict[str, Any] = {"num_cpus": 1}
        if cfg.async_training.mode != "sync":
            # OpenMP threads sleep instead of spinning while they wait: spinning threads on shared cores made
            # both sides ~4x slower on 2 cores (docs/benchmarks.md, async vs sync).
            res["runtime_env"] = {"env_vars": {"OMP_WAIT_POLICY": "PASSIVE"}}
        return {"device": "cpu", "replicas": replicas, "trainer_ranks": ranks, "replica_res": res,
                "trainer_res": copy.deepcopy(res), "replica_threads": replica_threads, "trainer_threads": trainer_threads}
    from engine.plan.rollout_replica import replica_gpus

    tp = replica_gpus(cfg)
    return {"device": device, "replicas": replicas, "replica_res": {**accelerators(device, tp), "num_cpus": 1},
            "trainer_ranks": ranks, "trainer_res": {**accelerators(device, 1), "num_cpus": 1}, "replica_threads": 4,
            "trainer_threads": 4}
