"""`ElasticCores`: when one role waits, the other takes its threads — a pure core (no Ray, torch or clock).

On `device = "cpu"` in fully async mode the plan splits the C cores between the two pools
(`engine.plan.placement`): each of the M trainer ranks computes with `t` intra-op threads, each of the R rollout
replicas with `r`, and `M·t + R·r ≤ C`. When one role waits — the trainer for a batch (the queue is short), the
rollout for the staleness budget, a sync's pause or the end of the stream (no dispatch out) — its share idles
while the other role runs on its own. With `resources.elastic_cores = true` this core moves the waiting role's
share to the computing one and gives it back before the lender computes again:

    both compute, or both wait    trainer t, rollout r                  (the plan's split)
    trainer computes, rollout waits  trainer t + ⌊R·r / M⌋, rollout r   (the trainer borrows the replicas' share)
    rollout computes, trainer waits  trainer t, rollout r + ⌊M·t / R⌋   (each replica borrows its part)

Events (facts both shells already see): `trainer(computing, seq)` — the trainer starts a local step (True) or
waits for a batch (False); `seq` numbers the trainer's reports so a report overtaken by a later one (the
shell may send the wait without waiting for its answer) is ignored — and `rollout(computing)`: at least one
dispatch is out on a replica (True) or none (False). Each returns `SetThreads(role, n)` commands, the
reclaims (a borrower going back to its share) before the grants, each role's new thread count once.

Invariant (checked by the simulator, `engine.loop.sim.checks.Checker.on_threads`): the threads granted to the
roles that compute never exceed the cores of the two pools, `M·granted_t + R·granted_r ≤ M·t + R·r` whenever
both compute. A command takes effect at the role's next boundary, so the threads *in use* may exceed that
only in one bounded window: after a reclaim, until the borrower's next boundary — at most the rest of one
trainer step (trainer borrowing) or one decode step (a replica borrowing) — while the lender already
computes with its own share. `enabled = False` (the default off switch) returns no command at all: today's
fixed split exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.loop.commands import SetThreads

TRAINER = "trainer"
ROLLOUT = "rollout"
ROLES = (TRAINER, ROLLOUT)


@dataclass(frozen=True)
class ElasticParams:
    """The plan's split (`engine.plan.placement.actor_resources`) and the switch."""

    trainer_threads: int
    """`t`: intra-op threads of each trainer rank in the plan's split."""
    replica_threads: int
    """`r`: intra-op threads of each rollout replica in the plan's split."""
    ranks: int = 1
    replicas: int = 1
    enabled: bool = False


def lendable(p: ElasticParams) -> dict[str, int]:
    """Per unit of each role, the threads it gets on top of its share while the other role waits."""
    return {TRAINER: (p.replicas * p.replica_threads) // max(1, p.ranks),
            ROLLOUT: (p.ranks * p.trainer_threads) // max(1, p.replicas)}


class ElasticCores:
    """The lending decision (see the module docstring). `granted[role]`: the threads per unit last commanded
    (the plan's split until the first command)."""

    def __init__(self, params: ElasticParams) -> None:
        self.p = params
        self.base = {TRAINER: max(1, params.trainer_threads), ROLLOUT: max(1, params.replica_threads)}
        self.computing = {TRAINER: True, ROLLOUT: True}  # nothing lent before the first wait
        self.granted = dict(self.base)
        self.lends = {TRAINER: 0, ROLLOUT: 0}
        """How many times each role lent its share (the metric `asyncrl/elastic/lends/<role>`)."""
        self._seq = -1

    @property
    def cores(self) -> int:
        """The cores of the two pools: M·t + R·r."""
        return self.p.ranks * self.base[TRAINER] + self.p.replicas * self.base[ROLLOUT]

    def in_use(self, computing: dict[str, bool] | None = None) -> int:
        """Threads granted to the roles that compute (`computing`: who does; default: as this core believes)."""
        c = self.computing if computing is None else computing
        units = {TRAINER: self.p.ranks, ROLLOUT: self.p.replicas}
        return sum(units[r] * self.granted[r] for r in ROLES if c[r])

    def target(self) -> dict[str, int]:
        """The threads per unit each role should compute with now."""
        t = dict(self.base)
        c = self.computing
        if c[TRAINER] and not c[ROLLOUT]:
            t[TRAINER] += lendable(self.p)[TRAINER]
        elif c[ROLLOUT] and not c[TRAINER]:
            t[ROLLOUT] += lendable(self.p)[ROLLOUT]
        return t

    # ------------------------------------------------------------------ events
    def trainer(self, computing: bool, seq: int | None = None) -> list[SetThreads]:
        """The trainer starts a local step (`computing`) or waits for a batch; `seq`: the report's number
        (a report older than one already taken is ignored)."""
        if seq is not None:
            if seq <= self._seq:
                return []
            self._seq = seq
        return self._set(TRAINER, computing)

    def rollout(self, computing: bool) -> list[SetThreads]:
        """At least one dispatch is out on a replica (`computing`), or none."""
        return self._set(ROLLOUT, computing)

    def _set(self, role: str, computing: bool) -> list[SetThreads]:
        if not self.p.enabled or self.computing[role] == computing:
            return []
        self.computing[role] = computing
        if not computing:
            self.lends[role] += 1
        new = self.target()
        changed = [r for r in ROLES if new[r] != self.granted[r]]
        changed.sort(key=lambda r: new[r] > self.granted[r])  # reclaims before grants
        self.granted = new
        return [SetThreads(r, new[r]) for r in changed]
