"""The rollouter's dispatch table: which requests run on which replica, several dispatches per replica.

A replica has a `Capacity`: `rows`, the sequences it runs at once (`rollout.max_num_seqs`, at least `n`), and
`calls`, the dispatches it accepts at once (a backend with continuous batching: several, whose rows share its
running batch; one without: 1, one batch per call). The loop streams work to a replica while

    Σ rows of its dispatches < rows   and   its dispatches < calls,

each new dispatch taking at most `room` rows:

    room = free rows          if it is the replica's last free call (calls = 1: one batch per call, as before)
    room = min(free rows, n)  otherwise (one group, or put-back requests, per call).

So while work is scarce (the staleness budget admits fewer prompts than the rows hold) every group runs in
its own call and is queued as soon as its own samples finish; when work is plenty the last call fills the
rows left. The rows a finished call frees are refilled at the next tick instead of idling until the
replica's longest answer ends.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.types import GenRequest


STREAM_CALLS = 12
"""Dispatches the rollouter sends one replica at once when its backend batches continuously (`hf`, `vllm`: a
`capacity()` method); the replica actor keeps threads beside them for abort / resume / sync / stats."""


def replica_slots(rows: int, n: int, calls: int = STREAM_CALLS) -> int:
    """Dispatches one replica serves at once while work is scarce — one group of n rows each, as `Capacity.room`
    gives them: min(calls, rows // n), at least 1. `asyncrl plan` models a replica as that many slots."""
    return max(1, min(calls, rows // max(1, n)))


@dataclass(frozen=True)
class Capacity:
    """What one replica takes at once (see the module docstring)."""

    rows: int
    calls: int = 1

    def room(self, n: int, rows_out: int, calls_out: int) -> int:
        """Rows the next dispatch may take with `rows_out` rows in `calls_out` calls out (0: none)."""
        free = self.rows - rows_out
        if calls_out >= self.calls or free <= 0:
            return 0
        return free if self.calls - calls_out == 1 else min(free, n)


@dataclass
class Running:
    """One dispatch on a replica."""

    kind: str  # "train" | "val"
    requests: list[GenRequest]
    started: float
    replica: int = -1
    id: int = -1


class DispatchTable:
    """The dispatches out now, by id, with per-replica views and per-replica (rows, calls) counts kept as
    dispatches come and go (read at every tick for every replica). Change `by_id` only through `add` / `pop`."""

    def __init__(self) -> None:
        self.by_id: dict[int, Running] = {}
        self._next = 0
        self._rows: dict[int, int] = {}
        self._calls: dict[int, int] = {}

    def add(self, rid: int, kind: str, requests: list[GenRequest], now: float) -> Running:
        self._next += 1
        run = Running(kind, list(requests), now, rid, self._next)
        self.by_id[run.id] = run
        self._rows[rid] = self._rows.get(rid, 0) + len(run.requests)
        self._calls[rid] = self._calls.get(rid, 0) + 1
        return run

    def pop(self, dispatch_id: int) -> Running | None:
        run = self.by_id.pop(dispatch_id, None)
        if run is not None:
            self._rows[run.replica] -= len(run.requests)
            self._calls[run.replica] -= 1
        return run

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
            self.pop(r.id)
        return runs

    def room(self, rid: int, capacity: Capacity, n: int) -> int:
        """Rows the next dispatch to replica `rid` may take (`Capacity.room` with its rows and calls out now)."""
        return capacity.room(n, self._rows.get(rid, 0), self._calls.get(rid, 0))

    def rows_on(self, rid: int) -> int:
        """Σ rows of the dispatches out on replica `rid`."""
        return self._rows.get(rid, 0)

    def calls_on(self, rid: int) -> int:
        """Dispatches out on replica `rid`."""
        return self._calls.get(rid, 0)

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
