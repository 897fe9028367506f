"""Memory fit per accelerator for the trainer and the rollout: a view of `engine.plan.memory.predict_memory`
(the one memory model, with its named terms and measured activation coefficients) in GB (10⁹ bytes) for
`validate` and `init` (its layout search, `init_choices`). No arithmetic of its own."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from engine.plan.sizes import trainer_world
from engine.plan.hardware import HardwarePreset
from asyncrl_cli.config.hf_model import ModelFacts
from engine.config.schema import RunConfig
from engine.plan.memory import DTYPE_BYTES, GB, RoleMemory, predict_memory, rollout_memory, trainer_memory

__all__ = ["DTYPE_BYTES", "FitReport", "RoleFit", "estimate_fit", "rollout_fit", "trainer_fit"]


@dataclass
class RoleFit:
    """Per-accelerator memory of one role: named components, their total, and the capacity (GB); `host_gb`:
    terms held in host memory on accelerator hardware (not counted in the total)."""

    role: str
    components_gb: dict[str, float]
    total_gb: float
    capacity_gb: float
    fits: bool
    details: dict[str, Any] = field(default_factory=dict)
    host_gb: dict[str, float] = field(default_factory=dict)

    @classmethod
    def of(cls, m: RoleMemory) -> RoleFit:
        return cls(m.role, {k: v / GB for k, v in m.terms.items()}, m.total / GB, m.capacity / GB, m.fits,
                   dict(m.details), {k: v / GB for k, v in m.host.items()})

    @property
    def headroom(self) -> float:
        """Free fraction of the capacity (negative when it does not fit)."""
        return 1 - self.total_gb / self.capacity_gb

    def to_json(self) -> dict[str, Any]:
        """A plain dict (rounded to 0.01 GB) for `--json` output."""
        d = asdict(self)
        d["components_gb"] = {k: round(v, 2) for k, v in self.components_gb.items()}
        d["host_gb"] = {k: round(v, 2) for k, v in self.host_gb.items()}
        d["total_gb"] = round(self.total_gb, 2)
        d["capacity_gb"] = round(self.capacity_gb, 2)
        return d


def trainer_fit(cfg: RunConfig, f: ModelFacts, hw: HardwarePreset) -> RoleFit:
    """Per-GPU memory of one trainer rank (`engine.plan.memory.trainer_memory`)."""
    return RoleFit.of(trainer_memory(cfg, f, trainer_world(cfg), hw.memory_gb * GB, hw.device))


def rollout_fit(cfg: RunConfig, f: ModelFacts, hw: HardwarePreset) -> RoleFit:
    """Per-GPU memory of one rollout replica rank (`engine.plan.memory.rollout_memory`)."""
    return RoleFit.of(rollout_memory(cfg, f, hw.memory_gb * GB, hw.device))


@dataclass
class FitReport:
    """Trainer and rollout fit."""

    trainer: RoleFit
    rollout: RoleFit

    def to_json(self) -> dict[str, Any]:
        """A plain dict for `--json` output."""
        return {"trainer": self.trainer.to_json(), "rollout": self.rollout.to_json()}


def estimate_fit(cfg: RunConfig, f: ModelFacts, hw: HardwarePreset) -> FitReport:
    """Both roles' memory fit (one `predict_memory` call)."""
    p = predict_memory(cfg, f, trainer_world=trainer_world(cfg), memory_gb=hw.memory_gb, device=hw.device)
    return FitReport(RoleFit.of(p.trainer), RoleFit.of(p.rollout))
