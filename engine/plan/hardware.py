"""Hardware presets (`presets/hardware/*.toml`): one kind of node, described once.

A run names its hardware in `[resources] hardware`; validate checks the per-node accelerator counts and
the per-accelerator memory against it, and the engine puts its compute on the preset's `device`. On
`device = "cpu"` hardware, "GPUs" are worker processes and `memory_gb` is the host memory one worker may use.
"""

from __future__ import annotations

import difflib
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from engine.plan.devices import RoleDevice, collective_env, role_devices
from engine.plan.presets import presets_dir

if TYPE_CHECKING:
    from engine.config.schema import RunConfig


class HardwarePreset(BaseModel):
    """One node type."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False)

    name: str
    """Short name, as used in `[resources] hardware`."""
    description: str = ""
    """Human-readable description (model, memory, node layout)."""
    device: Literal["cuda", "npu", "cpu"]
    """Accelerator kind: `cuda` (NVIDIA), `npu` (Ascend), `cpu` (worker processes)."""
    gpus_per_node: int = Field(gt=0)
    """Accelerators per node."""
    memory_gb: float = Field(gt=0)
    """Memory of one accelerator in GB (10⁹ bytes)."""
    interconnect: str = ""
    """Intra-node / inter-node links, e.g. `nvlink+ib`, `hccs+roce`, `pcie`, `none`."""
    bf16_tflops: float | None = Field(None, gt=0)
    """Dense bf16 peak of one accelerator (for throughput estimates)."""
    memory_bandwidth_gbs: float | None = Field(None, gt=0)
    """Peak memory bandwidth of one accelerator in GB/s (`asyncrl plan`'s decode-cost estimate)."""
    host_memory_gb: float | None = Field(None, gt=0)
    """Host RAM of one node in GB (10⁹ bytes): `asyncrl rehearse` checks that no node's host peak (the sum of its
    ranks' host peaks) exceeds it. None: not declared, not checked."""
    tested: bool = True
    """False when asyncrl has not been run on this hardware (validate adds a note)."""
    collective_env: dict[str, str] = Field(default_factory=dict)
    """Default collective settings of this hardware (`NCCL_*`, `HCCL_*`, `GLOO_SOCKET_IFNAME`), given to every trainer
    rank and replica; the launching shell's variables and `resources.collective_env` override them."""


class HardwareNotFound(LookupError):
    """The named hardware preset does not exist; `suggestions` holds close names."""

    def __init__(self, name: str, suggestions: list[str]) -> None:
        hint = f"; did you mean {', '.join(repr(s) for s in suggestions)}?" if suggestions else ""
        super().__init__(f"unknown hardware {name!r}{hint}")
        self.name = name
        self.suggestions = suggestions


class HardwareInvalid(ValueError):
    """A hardware preset file that does not parse or validate."""


def hardware_names() -> list[str]:
    """Names of the shipped hardware presets."""
    return sorted(p.stem for p in (presets_dir() / "hardware").glob("*.toml"))


def hardware_path(name: str, base_dir: Path | None = None) -> Path:
    """The file of hardware `name` (a preset name, or a path to a .toml file)."""
    if name.endswith(".toml"):
        p = Path(name).expanduser()
        if not p.is_absolute() and base_dir is not None:
            p = base_dir / p
        if p.is_file():
            return p
        raise HardwareNotFound(name, [])
    p = presets_dir() / "hardware" / f"{name}.toml"
    if p.is_file():
        return p
    raise HardwareNotFound(name, difflib.get_close_matches(name, hardware_names(), n=3, cutoff=0.5))


def load_hardware(name: str, base_dir: Path | None = None) -> HardwarePreset:
    """Load and validate a hardware preset by name or path."""
    path = hardware_path(name, base_dir)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        data.setdefault("name", path.stem)
        return HardwarePreset.model_validate(data)
    except (tomllib.TOMLDecodeError, ValidationError) as e:
        raise HardwareInvalid(f"{path}: {e}") from None


def run_devices(cfg: RunConfig, hw: HardwarePreset) -> dict[str, RoleDevice]:
    """Each role's `RoleDevice` on `hw` (`engine.plan.devices`), with the run's collective environment."""
    env = collective_env(hw.collective_env, cfg.resources.collective_env)
    from engine.plan.rollout_replica import replica_gpus

    return role_devices(hw.device, replica_gpus(cfg), env)  # a replica's workers: TP × PP × DP
