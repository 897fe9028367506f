"""What a rehearsal measured: one `RankClass` per group of symmetric trainer ranks, the run's roles, failures.

Every byte figure is measured on fake tensors of the real shapes (`engine.rehearse.fake`):

    device_peak       the most bytes alive at once on the rank's device during the step (FSDP2:
                      `FSDPMemTracker`; Megatron: `MemTracker`), with the category breakdown at that moment
    phase_peaks       the running peak after each phase (log-prob passes, reference, update): which phase sets it
    host_start        host bytes the rank holds while it builds its backends (the model as loaded before it is
                      moved to the device and sharded; the reference's too) — what the run's own code loads on
                      that rank (FSDP2: rank 0 only, the others get their shards from it)
    host_resident     host bytes held from the start to the end: the π_prox snapshot and its swap buffers
                      (decoupled mode), an offloaded reference
    host_export       host bytes the weight export holds on the rank (0 where it gathers on the device)
    host_save         host bytes the checkpoint's state dicts hold on the rank before they are written
    host_peak         max(host_start, host_resident + max(host_export, host_save)); summed per node in `nodes`
    sync              the weight export up to the bucket stage: bytes, dtypes, buckets, where the tensors live

A `RehearsalFailure` names the role, the rank and the phase; the CLI prints it as one line and exits 1.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

GB = 1e9


class RehearsalFailure(Exception):
    """A role that could not be built or stepped: `role` (trainer, reference, weight sync, rollout), `rank`,
    `phase`, and the first line of the error."""

    def __init__(self, role: str, rank: int | str, phase: str, message: str) -> None:
        self.role, self.rank, self.phase, self.message = role, rank, phase, message
        super().__init__(self.line())

    def line(self) -> str:
        return f"{self.role} rank {self.rank} ({self.phase}): {self.message}"

    def to_json(self) -> dict[str, Any]:
        return {"role": self.role, "rank": self.rank, "phase": self.phase, "message": self.message}


def first_line(exc: BaseException) -> str:
    """`Type: first line of the message` (at most 300 characters); a first line that ends in a colon announces
    the next (torch's `Error(s) in loading state_dict for …:` then the keys), which is joined to it."""
    text = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    line = f"{text[0]} {text[1]}" if len(text) > 1 and text[0].endswith(":") else text[0] if text else ""
    return f"{type(exc).__name__}: {line[:300]}".rstrip(": ")


@dataclass
class RankClass:
    """One class of symmetric trainer ranks, rehearsed through one representative rank."""

    name: str
    ranks: str
    """Which ranks the class stands for ("0", "1-63")."""
    rank: int
    """The rank rehearsed."""
    device_peak: int = 0
    peak_by_category: dict[str, int] = field(default_factory=dict)
    phase_peaks: dict[str, int] = field(default_factory=dict)
    phase_categories: dict[str, dict[str, int]] = field(default_factory=dict)
    """Each phase's peak by category, where the rehearsal measured phases apart (Megatron)."""
    host_start: int = 0
    host_resident: int = 0
    host_export: int = 0
    host_save: int = 0
    sync: dict[str, Any] = field(default_factory=dict)
    checkpoint: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    """What of this rank was not rehearsed, and why."""
    model_excludes: list[str] = field(default_factory=list)
    """Memory-model terms the rehearsed peak does not contain (what was not rehearsed), left out of the comparison."""
    seconds: float = 0.0

    @property
    def host_peak(self) -> int:
        return max(self.host_start, self.host_resident + max(self.host_export, self.host_save))

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["host_peak"] = self.host_peak
        return d


@dataclass
class Rehearsal:
    """The whole rehearsal of one run file."""

    name: str
    device: str
    backend: str
    world: int
    layout: dict[str, Any]
    transport: dict[str, Any] = field(default_factory=dict)
    vllm: dict[str, Any] = field(default_factory=dict)
    micro_batches: dict[str, Any] = field(default_factory=dict)
    ranks: list[RankClass] = field(default_factory=list)
    model_memory: dict[str, Any] = field(default_factory=dict)
    """`validate`'s memory model of a trainer rank (terms in bytes), for the comparison."""
    nodes: list[dict[str, Any]] = field(default_factory=list)
    """Each trainer node's host peak against its RAM (`engine.rehearse.nodes`)."""
    failures: list[RehearsalFailure] = field(default_factory=list)
    auto: list[str] = field(default_factory=list)
    """The launch's "auto" decisions (`engine.launch.probe.resolve_auto`), one line each."""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.failures

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "device": self.device, "backend": self.backend,
                "world": self.world, "layout": self.layout, "transport": self.transport, "vllm": self.vllm,
                "micro_batches": self.micro_batches, "ranks": [r.to_json() for r in self.ranks],
                "model_memory": self.model_memory, "nodes": self.nodes, "failures": [f.to_json() for f in self.failures],
                "auto": self.auto, "seconds": round(self.seconds, 1)}
