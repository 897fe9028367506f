"""The placement plan a run will ask Ray for: which actors, how many GPUs each, on which nodes.

Trainer and rollout pools are disjoint (verl fully async). The trainer is one worker per GPU; the rollout is
`replicas` engines of `tensor_parallel_size` GPUs each, packed node by node (a replica never spans nodes).
Which node and which bundles each actor takes comes from `asyncrl_cli.config.layout` — the same formula the
driver reserves Ray placement groups with. Controller, message queue and rollouter are CPU actors on the head
node.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from asyncrl_cli.config.derived import Derived
from asyncrl_cli.config.hardware import HardwarePreset
from asyncrl_cli.config.layout import LayoutError, PoolLayout, config_layout, describe_slots
from asyncrl_cli.config.schema import RunConfig


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


def plan_placement(cfg: RunConfig, d: Derived, hw: HardwarePreset | None) -> Placement:
    """Lay the trainer and rollout pools out over their nodes."""
    res, t, r = cfg.resources, cfg.trainer, cfg.rollout
    tp = r.tensor_parallel_size
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
            f"{r.backend} tp{tp}"
        ),
        ActorGroup("TrainerWorker", d.trainer_world, 1, trainer_nodes, layout),
    ]
    return Placement(hw.device if hw else "unknown", nodes, actors, pools)


def _node_order(label: str) -> int:
    return int(label.rsplit("-", 1)[1])
