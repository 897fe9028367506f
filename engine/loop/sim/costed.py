"""The simulator with a cost model: the same `World` (the real loop cores), with decode steps that cost more
for a bigger running batch, a prefill cost, a fixed cost per training step, a response-length distribution
with a chosen short range, and a timeline of every sync (what `asyncrl plan` measures).

A dispatch of requests with remaining lengths r_1..r_m runs its first k decode steps in

    T(k) = prefill + k · a + b · Σ_i min(r_i, k)        prefill = p · Σ_i (prompt_tokens + len(prefix_i))

a = `token_cost` (seconds per decode step: reading the weights), b = `row_cost` (seconds per running row and
step: its KV cache and its share of the FLOPs), p = `prefill_cost` (seconds per prompt token; a resumed partial
rollout prefills its prefix again). Rows leave the batch as they finish, so a long tail costs a + b·(few rows)
per step. An abort returns at the first step boundary k with start + T(k) > now (at most the dispatch's end). A training step takes
`tokens · train_token_cost + train_step_overhead`. Several dispatches on one replica (a drawn capacity of
several calls) each follow T(k) on their own clock: the per-row cost of the others' rows is not charged to
them. With `exclusive` (shared accelerators) a training step waits until no dispatch is in flight. With
b = p = overhead = 0, `short_max = None` and no `exclusive` this is
exactly `World`'s cost model (and `World` itself, untouched, is what `asyncrl simulate --check` runs).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any

from engine.loop.commands import Train
from engine.loop.sim.replicas import SimDispatch
from engine.loop.sim.scenario import Scenario
from engine.loop.sim.world import World
from engine.types import GenRequest


@dataclass
class CostedScenario(Scenario):
    """A Scenario with the optional costs of the module docstring (defaults: World's model)."""

    row_cost: float = 0.0
    prefill_cost: float = 0.0
    prompt_tokens: int = 0
    train_step_overhead: float = 0.0
    short_max: int | None = None
    """Short responses are uniform on 1..short_max (None: max_new_tokens // 3); `long_tail` of them run to
    the token limit."""
    exclusive: bool = False
    """The trainer and the rollout share the accelerators (verl's colocate baseline): a training step starts
    only once no dispatch is in flight. Without it a sync-mode trainer starts its first step as soon as that
    step's groups are back, while other replicas still generate (asyncrl's sync mode on its own pools)."""


@dataclass
class SyncMark:
    """One sync: when the trainer asked for it, when the weights were loaded, and the counters at the end."""

    begin: float
    end: float = 0.0
    version: int = 0
    local_step: int = 0
    trainer_busy: float = 0.0
    rollout_busy: float = 0.0
    prompts_trained: int = 0


@dataclass
class _Dispatch:
    rem: list[int] = field(default_factory=list)
    prefill: float = 0.0


class CostedWorld(World):
    """`World` with the costs of `CostedScenario` and a sync timeline (`marks`)."""

    def __init__(self, s: CostedScenario) -> None:
        self.costs: dict[int, _Dispatch] = {}  # by dispatch id
        self._deferred: Train | None = None  # a training step waiting for the accelerators (`exclusive`)
        self.marks: list[SyncMark] = []
        self.trained_prompts = 0
        self._lengths: dict[str, int] = {}
        super().__init__(s)
        self.bound = float("inf")  # a plan has no liveness bound to prove: the heap drains
        self.slow = [5.0 if i == s.straggler else 1.0 for i in range(s.replicas)]

    # ------------------------------------------------------------------ costs
    def _length(self, request_id: str, start: int = 0) -> int:
        key = f"{request_id}:{start}" if start else request_id
        got = self._lengths.get(key)
        if got is not None:
            return got
        s = self.s
        if getattr(s, "short_max", None) is None:
            got = super()._length(request_id, start)
        else:
            h = zlib.crc32(f"{s.seed}:{key}".encode())
            long = (h % 1000) / 1000 < s.long_tail
            got = s.max_new_tokens if long else 1 + (h >> 10) % max(1, min(s.short_max, s.max_new_tokens))
        self._lengths[key] = got
        return got

    def _elapsed(self, rid: int, did: int, k: int) -> float:
        rep, d = self.replicas[rid], self.costs[did]
        return d.prefill + k * rep.cost + self.s.row_cost * self.slow[rid] * sum(min(r, k) for r in d.rem)

    def _simple(self) -> bool:
        return not (self.s.row_cost or self.s.prefill_cost)

    def _start(self, rid: int, did: int, kind: str, reqs: list[GenRequest]) -> None:
        if self._simple() or self.replicas[rid].is_aborted(kind):
            super()._start(rid, did, kind, reqs)
            return
        rem = [self._remaining(r) for r in reqs]
        tokens = sum(self.s.prompt_tokens + len(r.prefix_ids) for r in reqs)
        self.costs[did] = _Dispatch(rem, self.s.prefill_cost * self.slow[rid] * tokens)
        super()._start(rid, did, kind, reqs)

    def _schedule(self, rid: int, d: SimDispatch, steps: int) -> None:
        if self._simple():
            super()._schedule(rid, d, steps)
            return
        self._at(d.start + self._elapsed(rid, d.id, steps), "generated", (rid, d.id, d.token, steps))

    def _abort_dispatch(self, rid: int, d: SimDispatch) -> None:
        if self._simple() or d.id not in self.costs:
            super()._abort_dispatch(rid, d)
            return
        lo, hi = 1, max(self.costs[d.id].rem)
        while lo < hi:  # the first step boundary strictly after now
            mid = (lo + hi) // 2
            if d.start + self._elapsed(rid, d.id, mid) > self.now:
                hi = mid
            else:
                lo = mid + 1
        d.token = self._new_token()
        self._at(max(self.now, d.start + self._elapsed(rid, d.id, lo)), "generated", (rid, d.id, d.token, lo))

    def _on_generated(self, rid: int, did: int, token: int, steps: int) -> None:
        d = self.replicas[rid].dispatches.get(did)
        if d is not None and d.token == token:
            self.costs.pop(did, None)
        super()._on_generated(rid, did, token, steps)

    # ------------------------------------------------------------------ shared accelerators
    def _generating(self) -> bool:
        return any(r.dispatches for r in self.replicas)

    def _new_run(self, ckpt: Any) -> None:
        self._deferred = None  # a trainer that died with a step waiting starts over from its checkpoint
        super()._new_run(ckpt)

    def _kick(self) -> None:
        """After every event: a training step held for the accelerators starts once no dispatch is in flight
        (however the last one ended: finished, aborted, or its replica died)."""
        super()._kick()
        if self._deferred is not None and not self._generating():
            step, self._deferred = self._deferred, None
            super()._trainer_do(step)
            super()._kick()

    def _trainer_do(self, c: Any) -> list | None:
        if self.s.exclusive and isinstance(c, Train) and self._generating():
            self._deferred = c  # the trainer waits on the step; it starts when the last dispatch is back
            return None
        return super()._trainer_do(c)

    def _at(self, t: float, kind: str, args: tuple) -> None:
        if kind == "trained":  # the fixed cost of a step (World charges only its tokens)
            t += self.s.train_step_overhead
            self.trainer_busy += self.s.train_step_overhead
            self.trained_prompts += len(args[1])
        super()._at(t, kind, args)

    # ------------------------------------------------------------------ timeline
    def _sync_started(self) -> None:
        self.marks.append(SyncMark(begin=self.now))

    def _on_synced(self, run_epoch: int) -> None:
        super()._on_synced(run_epoch)
        if self.marks and self.marks[-1].end == 0.0:
            m = self.marks[-1]
            m.end, m.version, m.local_step = self.now, self.trainer.version, self.trainer.local_step
            m.trainer_busy, m.rollout_busy = self.trainer_busy, self.rollout_busy
            m.prompts_trained = self.trained_prompts
