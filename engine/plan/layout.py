"""The one formula for where each accelerator actor goes (pure Python: used by `launch --dry-run` and the driver).

A pool (trainer or rollout) of `nnodes × gpus_per_node` accelerators is reserved as one Ray placement group
per node, each of one bundle per accelerator, packed on that node (`STRICT_PACK`). Actors of `unit`
accelerators each are laid out in order, node by node, never across a node boundary:

    per_node = gpus_per_node // unit            actors per node
    actor i  → node i // per_node,  bundles [(i mod per_node)·unit, (i mod per_node)·unit + unit)

Trainer ranks are actors of one accelerator (unit 1): rank r → node r // gpus_per_node, bundle
r mod gpus_per_node. Megatron orders its ranks TP-innermost (rank = … + dp·(tp·cp) + cp·tp + tp_rank), so a TP
group of `tp` consecutive ranks stays on one node exactly when `tp` divides `gpus_per_node`; `pool_layout`
refuses a `group` that does not. A rollout replica of G = TP·PP·DP GPUs is an actor of unit G: its G
bundles lie on one node (a replica larger than a node is counted by `validate` and `plan` but refused here, so
the driver does not launch it yet). Only the nodes that hold an actor are reserved, each with as many bundles as its
actors use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.config.schema import RunConfig



class LayoutError(ValueError):
    """The pool cannot hold the actors asked of it (the message names the key and the reason)."""


@dataclass(frozen=True)
class Slot:
    """Where one actor goes: its node (index within the pool) and its bundles (indices within the node)."""

    node: int
    bundles: tuple[int, ...]


@dataclass(frozen=True)
class PoolLayout:
    """One pool's reservation: bundles per node (one per accelerator) and each actor's slot, in actor order."""

    pool: str
    unit: int
    node_bundles: tuple[int, ...]
    """Bundles (accelerators) reserved on each node of the pool, node 0 first."""
    slots: tuple[Slot, ...]

    @property
    def nnodes(self) -> int:
        return len(self.node_bundles)

    @property
    def total_bundles(self) -> int:
        return sum(self.node_bundles)

    def actors_on(self, node: int) -> list[int]:
        """Indices of the actors placed on `node`."""
        return [i for i, s in enumerate(self.slots) if s.node == node]

    def to_json(self) -> dict:
        return {"pool": self.pool, "unit": self.unit, "node_bundles": list(self.node_bundles),
                "slots": [{"node": s.node, "bundles": list(s.bundles)} for s in self.slots]}


def pool_layout(pool: str, nnodes: int, gpus_per_node: int, count: int, unit: int = 1,
                group: int = 1) -> PoolLayout:
    """Lay `count` actors of `unit` accelerators out over a pool of `nnodes × gpus_per_node` (module docstring).
    `group`: consecutive actors that must share a node (a Megatron TP group). Raises `LayoutError`."""
    key = f"resources.{pool}.gpus_per_node"
    if unit > gpus_per_node:
        raise LayoutError(f"{key}: an actor of {unit} accelerators does not fit a node of {gpus_per_node}: a "
                          "rollout replica spanning nodes is planned and counted (validate, plan, init) but not yet "
                          "placed by the runtime")
    if nnodes > 1 and (gpus_per_node // unit) % group:
        raise LayoutError(f"{key}: groups of {group} ranks would span nodes of {gpus_per_node} accelerators")
    per_node = gpus_per_node // unit
    if count > per_node * nnodes:
        raise LayoutError(f"{key}: {count} actors × {unit} accelerators do not fit {nnodes} node(s) × "
                          f"{gpus_per_node} ({per_node} per node)")
    if count < 1:
        raise LayoutError(f"{key}: a pool needs at least one actor")
    slots = tuple(Slot(i // per_node, tuple(range((i % per_node) * unit, (i % per_node) * unit + unit)))
                  for i in range(count))
    used = slots[-1].node + 1
    node_bundles = tuple(sum(len(s.bundles) for s in slots if s.node == n) for n in range(used))
    return PoolLayout(pool, unit, node_bundles, slots)


def run_layout(trainer_nnodes: int, trainer_gpus_per_node: int, trainer_tp: int, rollout_nnodes: int,
               rollout_gpus_per_node: int, replicas: int, rollout_tp: int) -> dict[str, PoolLayout]:
    """Both pools of a run: `trainer` (one rank per accelerator, TP groups on one node) and `rollout`."""
    ranks = trainer_nnodes * trainer_gpus_per_node
    return {
        "trainer": pool_layout("trainer", trainer_nnodes, trainer_gpus_per_node, ranks, 1, trainer_tp),
        "rollout": pool_layout("rollout", rollout_nnodes, rollout_gpus_per_node, replicas, rollout_tp),
    }


def config_layout(cfg: RunConfig, replicas: int) -> dict[str, PoolLayout]:
    """`run_layout` for a `RunConfig` with `replicas` rollout replicas."""
    from engine.plan.rollout_replica import replica_gpus

    res, t = cfg.resources, cfg.trainer
    tp = t.tp if t.backend == "megatron" else 1

    return run_layout(res.trainer.nnodes, res.trainer.gpus_per_node, tp, res.rollout.nnodes,
                      res.rollout.gpus_per_node, replicas, replica_gpus(cfg))


def describe_slots(layout: PoolLayout, node: int) -> str:
    """'replica 0: 0-3, replica 1: 4-7' style summary of what the actors on `node` take."""
    name = "rank" if layout.pool == "trainer" else "replica"
    parts = []
    for i in layout.actors_on(node):
        b = layout.slots[i].bundles
        parts.append(f"{name} {i}: {b[0]}" + (f"-{b[-1]}" if len(b) > 1 else ""))
    if layout.pool == "trainer" and len(parts) > 2:
        first, last = layout.actors_on(node)[0], layout.actors_on(node)[-1]
        return f"ranks {first}-{last} → bundles 0-{layout.node_bundles[node] - 1}"
    return ", ".join(parts)
