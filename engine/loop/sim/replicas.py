"""The simulator's rollout replicas: several dispatches per replica, abort at a token boundary, deaths.

A replica has a capacity (rows, calls), drawn per replica by the scenario, which the loop core is told. Each
dispatch runs on its own clock: it generates in `max(remaining tokens) × token_cost` from its start (the
rows of several calls share the replica's batch; with one call this is one batch per call). An `Abort`
marks the replica's training calls — and with `validation` its validation calls — aborted until `Resume`:
each such dispatch returns at its next token boundary with the tokens generated so far, and one dispatched
while the mark holds returns at once with none. A replica is busy while at least one dispatch is out
(`rollout_busy` sums those intervals). A death drops its dispatches (the loop core re-queues them).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

from engine.loop.sim.tools import MODEL_LOG_PROB, MODEL_TOKEN, turn_start
from engine.types import GenRequest, GenResult


@dataclass
class SimDispatch:
    id: int
    kind: str
    requests: list[GenRequest]
    start: float
    token: int = 0  # changes on abort: the completion scheduled before it is ignored
    cut: bool = False  # aborted: its return is scheduled at a token boundary
    turns: list[tuple[int, int, int]] = field(default_factory=list)  # `_turn` of each request, fixed at the start


@dataclass
class SimReplica:
    version: int = 0
    alive: bool = True
    aborted: bool = False  # training calls abort
    aborted_val: bool = False  # validation calls abort (at a stop)
    cost: float = 0.01
    rows: int = 1
    calls: int = 1
    dispatches: dict[int, SimDispatch] = field(default_factory=dict)
    busy_since: float | None = None
    threads: int = 1  # elastic cores: what its decode steps run with
    want_threads: int = 1  # the last `SetThreads("rollout")`, taken at the next decode step
    threads_due: float = 0.0  # when the last `SetThreads` takes effect (its next decode step)

    def is_aborted(self, kind: str) -> bool:
        return self.aborted_val if kind == "val" else self.aborted

    def reset(self) -> None:
        """Death or a new run: nothing out, no abort mark."""
        self.dispatches.clear()
        self.aborted = self.aborted_val = False
        self.busy_since = None


class SimReplicas:
    """The rollout-replica side of `World` (a mixin: uses `s`, `now`, `replicas`, `_at`, `_execute`,
    `rollout`, `rollout_busy`)."""

    _token = 0
    tokens_out = 0
    """Model tokens of training work returned so far (a measure of progress: `World`'s stall budget)."""

    def _length(self, request_id: str, start: int = 0) -> int:
        """The full length of a request's (model) turn starting at `start` (a pure function of seed, id and
        start: the same on resume)."""
        h = zlib.crc32((f"{self.s.seed}:{request_id}" + (f":{start}" if start else "")).encode())
        if (h % 1000) / 1000 < self.s.long_tail:
            return self.s.max_new_tokens
        return 1 + (h >> 10) % max(1, self.s.max_new_tokens // 3)

    def _turn(self, req: GenRequest) -> tuple[int, int, int]:
        """(the length of the turn `req` generates, its tokens already in the prefix, the tokens this call
        generates: the rest of the turn within the request's budget, at least 1)."""
        start = turn_start(req.prefix_ids)
        length, done = self._length(req.request_id, start), len(req.prefix_ids) - start
        return length, done, max(1, min(req.max_new_tokens, length - done))

    def _remaining(self, req: GenRequest) -> int:
        return self._turn(req)[2]

    def _new_token(self) -> int:
        self._token += 1
        return self._token

    def _start(self, rid: int, did: int, kind: str, reqs: list[GenRequest]) -> None:
        rep = self.replicas[rid]
        d = SimDispatch(did, kind, reqs, self.now, self._new_token(), turns=[self._turn(r) for r in reqs])
        if len(rep.dispatches) >= rep.calls or sum(len(x.requests) for x in rep.dispatches.values()) \
                + len(reqs) > rep.rows:
            self.check.violation("capacity", f"replica {rid} sent {len(reqs)} rows beyond its capacity "
                                 f"({rep.rows} rows, {rep.calls} calls): {self.describe()}")
        if not rep.dispatches:
            rep.busy_since = self.now
            rep.threads = rep.want_threads  # an idle replica's next decode step is this dispatch's first
        rep.dispatches[did] = d
        if rep.is_aborted(kind):  # an aborted call returns at once (the core never sends one; safety)
            d.cut = True
            self._at(self.now, "generated", (rid, did, d.token, 0))
            return
        self._schedule(rid, d, max(t[2] for t in d.turns))

    def _schedule(self, rid: int, d: SimDispatch, steps: int) -> None:
        """The completion of a dispatch that runs `steps` decode steps."""
        self._at(d.start + steps * self.replicas[rid].cost, "generated", (rid, d.id, d.token, steps))

    def _abort(self, rid: int, validation: bool) -> None:
        rep = self.replicas[rid]
        rep.aborted = True
        rep.aborted_val = rep.aborted_val or validation
        if not rep.alive:
            return
        for d in rep.dispatches.values():
            if rep.is_aborted(d.kind) and not d.cut:
                d.cut = True
                self._abort_dispatch(rid, d)

    def _abort_dispatch(self, rid: int, d: SimDispatch) -> None:
        rep = self.replicas[rid]
        done = int((self.now - d.start) / rep.cost) + 1  # the next token boundary
        d.token = self._new_token()
        self._at(d.start + done * rep.cost, "generated", (rid, d.id, d.token, done))

    def _resume(self, rid: int) -> None:
        rep = self.replicas[rid]
        rep.aborted = rep.aborted_val = False

    def _on_generated(self, rid: int, did: int, token: int, steps: int) -> None:
        rep = self.replicas[rid]
        d = rep.dispatches.get(did)
        if d is None or d.token != token or not rep.alive:
            return
        del rep.dispatches[did]
        if not rep.dispatches and rep.busy_since is not None:
            self.rollout_busy += self.now - rep.busy_since
            rep.busy_since = None
        out, calls = [], {}
        for req, turn in zip(d.requests, d.turns):
            length, done, remaining = turn
            k = min(steps, remaining)
            self.tokens_out += k if d.kind == "train" else 0
            ids = list(req.prefix_ids) + [MODEL_TOKEN] * k
            log_probs = list(req.prefix_log_probs or [0.0] * len(req.prefix_ids)) + [MODEL_LOG_PROB] * k
            first = req.min_version if req.prefix_ids and req.min_version is not None else rep.version
            if k < remaining:
                reason = "abort"
            else:
                reason = "length" if k >= req.max_new_tokens and length > done + k else "stop"
            out.append(GenResult(req.request_id, ids, log_probs, reason, first, rep.version, k))
            if self.s.multi_turn and reason != "abort":  # validation conversations call tools too
                calls[req.request_id] = self._turn_calls(req)
        self._execute(self.rollout.generation_finished(rid, out, self.now, did, tool_calls=calls or None))
