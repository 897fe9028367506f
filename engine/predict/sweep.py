"""`asyncrl plan --sweep`: try a grid of layouts and rank them by predicted samples/s.

Dimensions: `rollout_fraction` (the share of the run's accelerators given to rollout; the rest train — the
rollout side is rounded to whole replicas of `tensor_parallel_size`, the trainer side to its model-parallel
size), `trigger` (trigger_parameter_sync_step) and `staleness` (staleness_threshold). A dimension not named
keeps the run's value. The training cost scales as 1 / trainer world (data parallel), the per-replica costs
do not change. Each point is a shorter, coarser simulation than the plan itself (speed ranks, not the last
per cent). The reason printed for a point is its bottleneck: the side that idles waits for the other.
Only speed is ranked: a larger trigger or staleness trains on staler samples (see the staleness column).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from engine.predict.costs import CostModel, Layout
from engine.predict.prediction import Prediction, simulate

DEFAULT_GRID: dict[str, list[float]] = {
    "rollout_fraction": [0.25, 0.375, 0.5, 0.625, 0.75, 0.875],
    "trigger": [1, 2, 4, 8],
    "staleness": [0.0, 0.25, 0.5, 1.0],
}


class SweepSpecError(ValueError):
    """A --sweep value that does not parse."""


def parse(spec: str) -> dict[str, list[float]]:
    """`rollout_fraction,trigger=1:2:4,staleness` → the grid (a bare name takes the default values)."""
    grid: dict[str, list[float]] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, _, values = part.partition("=")
        name = name.strip()
        if name not in DEFAULT_GRID:
            raise SweepSpecError(f"unknown sweep dimension {name!r}; use {', '.join(DEFAULT_GRID)}")
        try:
            grid[name] = [float(v) for v in values.split(":")] if values else list(DEFAULT_GRID[name])
        except ValueError:
            raise SweepSpecError(f"--sweep {part!r}: values are numbers separated by ':'") from None
    if not grid:
        raise SweepSpecError("--sweep names no dimension; e.g. --sweep rollout_fraction,trigger,staleness")
    return grid


@dataclass
class Point:
    rollout_fraction: float
    trigger: int
    staleness: float
    prediction: Prediction
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"rollout_fraction": self.rollout_fraction, "trigger": self.trigger, "staleness": self.staleness,
                "reason": self.reason, **self.prediction.to_json()}


def split(layout: Layout, fraction: float) -> Layout | None:
    """`layout` with `fraction` of its accelerators on rollout (None when no valid split is that close)."""
    total, tp, mp = layout.accelerators, layout.replica_gpus, max(1, layout.trainer_model_parallel)
    replicas = max(1, round(total * fraction / tp))
    trainer = total - replicas * tp
    trainer -= trainer % mp
    if trainer < mp or replicas < 1:
        return None
    return dataclasses.replace(layout, replicas=replicas, trainer_world=trainer)


def reason(p: Prediction) -> str:
    """Which side idles, and so which is the bottleneck."""
    if p.mode == "sync":
        return "sync: the two sides take turns"
    if p.trainer_idle_ratio > p.rollout_idle_ratio + 0.05:
        return f"rollout-bound: the trainer idles {p.trainer_idle_ratio:.0%} (give rollout more accelerators)"
    if p.rollout_idle_ratio > p.trainer_idle_ratio + 0.05:
        return f"trainer-bound: rollout idles {p.rollout_idle_ratio:.0%} (give training more accelerators)"
    return f"balanced: trainer idles {p.trainer_idle_ratio:.0%}, rollout {p.rollout_idle_ratio:.0%}"


def run(layout: Layout, costs: CostModel, grid: dict[str, list[float]], resolution: int = 32,
        measure: int = 3) -> list[Point]:
    """Every point of the grid, best (most samples/s) first."""
    accel = layout.accelerators
    fractions = grid.get("rollout_fraction", [layout.rollout_world / accel])
    triggers = [int(t) for t in grid.get("trigger", [layout.trigger])]
    stales = grid.get("staleness", [layout.staleness])
    points: list[Point] = []
    seen: set[tuple[int, int, int, float]] = set()
    for f in fractions:
        base = split(layout, f)
        if base is None:
            continue
        for t in triggers:
            for st in stales:
                lay = dataclasses.replace(base, loop=base.loop.with_knobs(trigger=t, staleness_threshold=st))
                key = (lay.replicas, lay.trainer_world, lay.trigger, lay.staleness)
                if key in seen:
                    continue
                seen.add(key)
                p = simulate(lay, costs, "sweep", measure=measure, resolution=resolution)
                points.append(Point(lay.rollout_world / accel, lay.trigger, lay.staleness, p, reason(p)))
    points.sort(key=lambda pt: -pt.prediction.samples_per_s)
    return points
