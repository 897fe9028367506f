"""The placement plan a run will ask Ray for: which actors, how many GPUs each, on which nodes.

The layout is computed in `engine.plan.placement`, with the same M and R the driver uses; this module keeps
the CLI's names and takes the loaded hardware preset.
"""

from __future__ import annotations

from engine.plan.hardware import HardwarePreset
from engine.plan.placement import ActorGroup, Placement
from engine.plan.placement import plan_placement as _plan
from engine.plan.sizes import Derived

__all__ = ["ActorGroup", "Placement", "plan_placement"]


def plan_placement(cfg, d: Derived, hw: HardwarePreset | None) -> Placement:
    """Lay the trainer and rollout pools out over their nodes, on `hw`'s device ("unknown" without one)."""
    return _plan(cfg, d, hw.device if hw else None)
