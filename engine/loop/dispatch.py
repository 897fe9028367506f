"""The rollouter's dispatch table: which requests run on which replica, several dispatches per replica.

A replica has a `Capacity`: `rows`, the sequences it runs at once (`rollout.max_num_seqs`, at least `n`), and
`calls`, the dispatches it accepts at once (a backend with continuous batching: several, whose rows share its
running batch; one without: 1, one batch per call). The loop streams work to a replica while

    Σ rows of its dispatches < rows   and   its dispatches < calls,

each new dispatch taking at most `min(free rows, chunk)` rows, with

    chunk = rows                                   if calls = 1 (one batch per call, as before streaming)
    chunk = n · ⌈⌈rows / calls⌉ / n⌉, at most rows   otherwise (whole groups; `calls` chunks fill the rows).

So a group's answers come back as soon as its own chunk is done, and the rows it frees are refilled at the
next tick instead of idling until the replica's longest answer ends.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from engine.types import GenRequest


@dataclass(frozen=True)
class Capacity:
    """What one replica takes at once (see the module docstring)."""

    rows: int
    calls: int = 1

    def chunk(self, n: int) -> int:
        """Rows per dispatch (whole groups of `n` when the replica takes several calls)."""
        if self.calls <= 1:
            return self.rows
        return max(1, min(self.rows, n * math.ceil(math.ceil(self.rows / self.calls) / max(1, n))))


@dataclass
class Running:
    """One dispatch on a replica."""

    kind: str  # "train" | "val"
    requests: list[GenRequest]
    started: float
    replica: int = -1
    id: int = -1


class DispatchTable:
    """The dispatches out now, by id, with per-replica views."""

    def __init__(self) -> None:
        self.by_id: dict[int, Running] = {}
        self._next = 0

    def add(self, rid: int, kind: str, requests: list[GenRequest], now: float) -> Running:
        self._next += 1
        run = Running(kind, list(requests), now, rid, self._next)
        self.by_id[run.id] = run
        return run

    def pop(self, dispatch_id: int) -> Running | None:
        return self.by_id.pop(dispatch_id, None)

    def find(self, rid: int, request_ids: list[str]) -> Running | None:
        """The dispatch of `rid` that sent these requests (for callers that do not pass a dispatch id)."""
        want = set(request_ids)
        on = self.on(rid)
        for run in on:
            if {r.request_id for r in run.requests} == want:
                return run
        return on[0] if len(on) == 1 else None

    def on(self, rid: int) -> list[Running]:
        """The dispatches of replica `rid`, oldest first."""
        return [r for r in self.by_id.values() if r.replica == rid]

    def pop_replica(self, rid: int) -> list[Running]:
        runs = self.on(rid)
        for r in runs:
            del self.by_id[r.id]
        return runs

    def rows_on(self, rid: int) -> int:
        return sum(len(r.requests) for r in self.by_id.values() if r.replica == rid)

    def calls_on(self, rid: int) -> int:
        return sum(1 for r in self.by_id.values() if r.replica == rid)

    def by_replica(self) -> dict[int, list[Running]]:
        out: dict[int, list[Running]] = {}
        for r in self.by_id.values():
            out.setdefault(r.replica, []).append(r)
        return out

    def replicas_running(self, kind: str) -> list[int]:
        return sorted({r.replica for r in self.by_id.values() if r.kind == kind})

    def any(self, kind: str) -> bool:
        return any(r.kind == kind for r in self.by_id.values())

    def __bool__(self) -> bool:
        return bool(self.by_id)

    def __len__(self) -> int:
        return len(self.by_id)
