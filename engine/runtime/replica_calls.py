"""The `generate` calls the rollouter has out on its replicas, several per replica, and their busy time.

Each call is one `Dispatch` of the loop core (`engine.loop.rollout`), known by its pending call (a replica peer's
`Pending`, `engine.runtime.peers`), its replica and
its dispatch id. A replica is busy while at least one of its calls is out; `take_active(now)` returns the
busy seconds summed over replicas since the last take (intervals still open are counted up to `now`), which
the rollouter reports as verl's `fully_async/rollouter/active_time`.

Seeds: a backend seeds each call's sampler from `SamplingParams.seed`, so calls sharing one seed would draw
the same uniforms row for row (the i-th sample of every group alike). Each call is sent the seed
`(seed · 1_000_003 + dispatch_id) mod 2^63` instead: reproducible for a given schedule, distinct per call.
In deterministic mode (`keyed = True`) the run's seed goes as it is: the draws are keyed by (seed, request id,
position) already (`engine.rollout.hf.keyed`), and dispatch ids restart at a resume, so they must not enter them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from engine.loop.dispatch import Capacity
from engine.runtime.peers import ReplicaPeer, Wait


def replica_capacities(replicas: list[ReplicaPeer]) -> list[Capacity]:
    """Each replica's `limits()` (rows, concurrent calls) as the loop core's `Capacity`."""
    asked = [r.limits() for r in replicas]
    return [Capacity(int(lim["rows"]), int(lim["calls"])) for lim in (p.result() for p in asked)]


def dispatch_seed(sampling: Any, dispatch_id: int) -> Any:
    """`sampling` with the seed of call `dispatch_id` (see the module docstring); unseeded stays unseeded."""
    if sampling.seed is None:
        return sampling
    return dataclasses.replace(sampling, seed=(sampling.seed * 1_000_003 + dispatch_id) % (1 << 63))


class ReplicaCalls:
    """pending call → (replica, dispatch id) of the calls out, and each replica's open busy interval; `wait` is the
    peers' (`engine.runtime.peers.RolloutPeers.wait`)."""

    def __init__(self, wait: Wait, keyed: bool = False) -> None:
        self.wait = wait
        self.keyed = keyed
        self.refs: dict[Any, tuple[int, int]] = {}
        self._open: dict[int, tuple[int, float]] = {}  # replica -> (calls out, busy since)
        self._active = 0.0

    def __bool__(self) -> bool:
        return bool(self.refs)

    def send(self, replica: ReplicaPeer, rid: int, dispatch_id: int, requests: list, sampling: Any, kind: str,
             now: float) -> None:
        """Start `generate` on `replica` under `dispatch_seed(sampling, dispatch_id)` (unless `keyed`)."""
        call = replica.generate(requests, sampling if self.keyed else dispatch_seed(sampling, dispatch_id), kind)
        self.refs[call] = (rid, dispatch_id)
        count, since = self._open.get(rid, (0, now))
        self._open[rid] = (count + 1, since)

    def ready(self, timeout: float) -> list[Any]:
        """The calls that returned (or failed): waits until the first one does, at most `timeout` seconds,
        then takes every other one that is also done."""
        if not self.refs:
            return []
        return self.wait(list(self.refs), timeout)


    def done(self, ref: Any, now: float) -> tuple[int, int]:
        """The call of `ref` is over: (replica, dispatch id)."""
        rid, did = self.refs.pop(ref)
        count, since = self._open.get(rid, (1, now))
        if count <= 1:
            self._open.pop(rid, None)
            self._active += now - since
        else:
            self._open[rid] = (count - 1, since)
        return rid, did

    def take_active(self, now: float) -> float:
        """Busy replica-seconds since the last take."""
        active = self._active + sum(now - since for _, since in self._open.values())
        self._open = {rid: (count, now) for rid, (count, _) in self._open.items()}
        self._active = 0.0
        return active
