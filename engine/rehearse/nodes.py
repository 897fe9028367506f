"""The trainer's nodes' host memory, from the rehearsed rank classes, against the hardware's node RAM.

Trainer rank r runs on node ⌊r / g⌋ (g = `resources.trainer.gpus_per_node`: the launch's placement fills one
node's bundles before the next). A node's host peak is the sum of its ranks' host peaks,

    host_peak(rank) = max(host_start, host_resident + max(host_export, host_save))

(`RankClass.host_peak`: the build's loaded copies are freed once the rank is sharded; what stays — a π_prox
snapshot and its swap buffers, an offloaded reference — is held beside the export's and the save's transients),
summed as if every rank peaked at once (a checkpoint is written by all ranks together; an upper bound otherwise).
The trainer and the rollout have nodes of their own (`resources.trainer` / `resources.rollout`), so nothing
else of the run's shares a trainer node; the driver runs on the head node and holds the dataset and the
tokenizer only (not counted). A node whose sum exceeds `hardware.host_memory_gb` fails the rehearsal with one
line naming the node, the role and its largest rank; hardware without that figure is reported, not checked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from engine.rehearse.report import GB, RankClass, RehearsalFailure

if TYPE_CHECKING:
    from engine.plan.run_plan import RunPlan


def class_ranks(cls: RankClass) -> list[int]:
    """The ranks a class stands for, from its `ranks` text ("0", "1-63", "2,5,7-9")."""
    out: list[int] = []
    for part in cls.ranks.split(","):
        lo, _, hi = part.strip().partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def node_host(plan: RunPlan, classes: list[RankClass]) -> tuple[list[dict[str, Any]], list[RehearsalFailure]]:
    """Each trainer node's host peak (module docstring) and a failure per node over its RAM."""
    per_node = max(1, plan.config.resources.trainer.gpus_per_node)
    capacity = getattr(plan.hardware, "host_memory_gb", None)
    peaks: dict[int, dict[str, Any]] = {}
    for cls in classes:
        for rank in class_ranks(cls):
            if rank >= plan.trainer_ranks:
                continue
            node = peaks.setdefault(rank // per_node, {"node": rank // per_node, "ranks": [], "host_peak": 0,
                                                       "largest_rank": rank, "largest": -1})
            node["ranks"].append(rank)
            node["host_peak"] += cls.host_peak
            if cls.host_peak > node["largest"]:
                node["largest_rank"], node["largest"] = rank, cls.host_peak
    nodes, failures = [], []
    for n in sorted(peaks):
        d = peaks[n]
        ranks = d.pop("ranks")
        d.pop("largest")
        d.update({"ranks": f"{min(ranks)}-{max(ranks)}" if len(ranks) > 1 else str(ranks[0]),
                  "host_memory": capacity * GB if capacity else None,
                  "fits": None if not capacity else d["host_peak"] <= capacity * GB})
        nodes.append(d)
        if d["fits"] is False:
            failures.append(RehearsalFailure(
                "trainer", d["largest_rank"], "node host memory",
                f"node {n} (trainer ranks {d['ranks']}) holds {d['host_peak'] / GB:.1f} GB of host memory at its "
                f"ranks' peaks, over the {capacity:g} GB of a {plan.hardware.name} node (largest: rank "
                f"{d['largest_rank']})"))
    return nodes, failures
