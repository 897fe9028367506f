"""The rollout replicas of a run, with replacement of dead ones under a failure budget.

A replica whose call raised `PeerDied` (`engine.runtime.peers`; Ray's `RayActorError`) has lost its process.
`fail(rid, cause)` marks it down and,
while fewer than `max_restarts` replacements were started over the run, starts a new actor in its slot
whose first call loads the newest weights the rollouter has seen (`set_latest`; before the first sync the
replacement's own base model is version 0). The slot is usable again once that call returns (`poll`); a
sync that lands meanwhile is caught up before the slot is released. A failure of the replacement itself
counts as one more failure. When the budget is spent `exhausted` holds the reason and nothing restarts.

The pool keeps references to the latest weight buckets, so they stay in the object store (one copy of the
model) until the next sync replaces them.

Collective weight sync (`engine.sync.collective`): a broadcast cannot be replayed, and every slot is a member
of the trainer's group. `generation` counts the replica processes replaced so far; the trainer announces
each sync with it (`sync_generation`), so after a replacement all members join a new group generation. A
replacement does not load anything when it starts: it waits (down, `waiting`) until the trainer sends it the
latest version in a catch-up group (`catch_up`, when the trainer still holds that version) or the next sync,
which it receives with every other slot (`update_live` includes it), and is released with those weights.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.runtime.peers import PeerDied, ReplicaPeer, Wait, describe_failure


@dataclass
class SyncOutcome:
    """One `update_live`: the receipts by slot, the slots that died meanwhile (slot, cause), and the
    replacements that joined with these weights."""

    receipts: dict[int, Any] = field(default_factory=dict)
    dead: list[tuple[int, str]] = field(default_factory=list)
    joined: list[int] = field(default_factory=list)


class ReplicaPool:
    """Slots `0..R-1`, each holding the current replica peer of one replica (`engine.runtime.peers.ReplicaPeer`);
    `spawn(rid)` starts a replacement, `wait` is the peers' wait over replica calls."""

    def __init__(self, replicas: list[ReplicaPeer], spawn: Callable[[int], ReplicaPeer] | None, max_restarts: int,
                 wait: Wait) -> None:
        self.replicas = list(replicas)
        self.spawn = spawn
        self.wait = wait
        self.max_restarts = max_restarts
        self.restarts = 0
        self.down: set[int] = set()
        self.latest: tuple[int, list] | None = None  # (version, bucket refs) of the newest weights
        self.exhausted: str | None = None
        self._starting: dict[Any, tuple[int, int]] = {}  # pending start call -> (slot, version being loaded)
        self.generation = 0  # replica processes replaced: the collective group's generation
        self.loaded: dict[int, int] = {}  # slot -> version its current process holds (tracked for replacements)
        self.waiting: set[int] = set()  # collective: replacements that are up and wait for the latest weights
        self._members: list[int] | None = None  # the slots of the last collective sync's group

    def __len__(self) -> int:
        return len(self.replicas)

    def live(self) -> list[int]:
        """Slots with a working replica."""
        return [i for i in range(len(self.replicas)) if i not in self.down]

    def set_latest(self, version: int, bucket_refs: list) -> None:
        self.latest = (version, list(bucket_refs))

    def fail(self, rid: int, cause: str) -> bool:
        """Slot `rid` lost its process. True when a replacement is starting; False when the budget is spent."""
        self.down.add(rid)
        self.waiting.discard(rid)
        self._starting = {ref: v for ref, v in self._starting.items() if v[0] != rid}
        if self.spawn is None or self.restarts >= self.max_restarts:
            self.exhausted = (f"rollout replica {rid} died ({cause}) and the restart budget "
                              f"rollout.max_replica_restarts = {self.max_restarts} is spent")
            return False
        self.restarts += 1
        self.generation += 1
        self.replicas[rid] = self.spawn(rid)
        self.loaded[rid] = 0
        self._load_latest(rid)
        return True

    def sync_members(self) -> tuple[int, list[int]]:
        """The group of the next collective sync: (generation, slots). Its members are the slots whose process
        is up — live, or a replacement waiting for weights; one still starting is left out (it catches up
        later) so the sync does not wait for its start-up. A new member set is a new generation."""
        members = sorted(set(self.live()) | self.waiting)
        if members != self._members:
            self.generation += 1 if self._members is not None else 0
            self._members = members
        return self.generation, members

    def collective(self) -> bool:
        """True when the newest weights were broadcast (they cannot be fetched again)."""
        from engine.sync.collective import CollectiveHandle

        return self.latest is not None and any(isinstance(r, CollectiveHandle) for r in self.latest[1])

    def _load_latest(self, rid: int) -> None:
        replica = self.replicas[rid]
        if self.latest is None or self.collective():  # collective: the next sync brings the weights
            self._starting[replica.ready()] = (rid, 0)
        else:
            version, refs = self.latest
            self._starting[replica.update_weights(refs, version)] = (rid, version)

    def poll(self) -> list[tuple[int, str | None]]:
        """Replacements whose start finished since the last poll: (slot, None) ready, (slot, cause) failed.
        A replacement that loaded weights older than `latest` is sent the newest first and reported later."""
        if not self._starting:
            return []
        ready = self.wait(list(self._starting), 0)
        out: list[tuple[int, str | None]] = []
        for call in ready:
            rid, loaded = self._starting.pop(call)
            try:
                call.result()
            except Exception as e:  # noqa: BLE001 - died, or its start raised (a task error): either is its failure
                out.append((rid, describe_failure(e)))
                continue
            loaded = max(loaded, self.loaded.get(rid, 0))
            if self.latest is not None and self.latest[0] > loaded:
                if not self.collective():
                    self._load_latest(rid)
                else:  # a catch-up or the next sync loads and releases it
                    self.waiting.add(rid)
                continue
            self.down.discard(rid)
            out.append((rid, None))
        return out

    def check_live(self) -> list[tuple[int, str]]:
        """Ask every live slot whether its process still runs; returns (slot, cause) for the dead ones."""
        calls = {rid: self.replicas[rid].ready() for rid in self.live()}
        dead: list[tuple[int, str]] = []
        for rid, call in calls.items():
            try:
                call.result()
            except PeerDied as e:
                dead.append((rid, describe_failure(e)))
        return dead

    def update_live(self, bucket_refs: list, version: int) -> SyncOutcome:
        """Load weights on every live replica — with a collective sync also on every replacement waiting for it
        (all slots are group members) — and collect their receipts (`engine.sync.verify`)."""
        return self._load(bucket_refs, version, self._targets(bucket_refs, version))

    def _targets(self, bucket_refs: list, version: int) -> list[int]:
        self.set_latest(version, bucket_refs)
        members = getattr(bucket_refs[0], "members", None) if self.collective() else None
        return self.live() if members is None else list(members)

    def stage_live(self, bucket_refs: list, version: int) -> tuple[list[int], SyncOutcome] | None:
        """A staged sync (`rollout.weight_sync_back_buffer`, `engine.sync.staging`): every replica `update_live`
        would load receives `version` into its back buffer while it keeps generating; returns the slots that
        staged it (`commit`) and the outcome so far (slots that died). None, before anything is sent, when
        some target does not stage (no back buffer): then `update_live` loads in place during the pause."""
        targets = self._targets(bucket_refs, version)
        if not targets:
            return None
        try:
            asks = [self.replicas[rid].stages_weights() for rid in targets]
            if not all([a.result() for a in asks]):  # a replica without back buffers: in place
                return None
        except PeerDied:  # a dead replica: the in-place path notices and reports it
            return None
        calls = {rid: self.replicas[rid].stage_weights(bucket_refs, version) for rid in targets}
        out, staged = SyncOutcome(), []
        for rid, call in calls.items():
            try:
                call.result()
                staged.append(rid)
            except PeerDied as e:
                out.dead.append((rid, describe_failure(e)))
        return staged, out

    def commit(self, version: int, staged: list[int], out: SyncOutcome) -> SyncOutcome:
        """Swap the staged `version` in on the slots `staged` (generation paused) and collect their receipts."""
        return self._collect({rid: self.replicas[rid].swap_weights(version) for rid in staged}, version, out)

    def catch_up(self, bucket_refs: list, version: int, slots: list[int]) -> SyncOutcome:
        """Load the latest weights (a catch-up broadcast of `version`) on the waiting replacements `slots`."""
        return self._load(bucket_refs, version, slots)

    def _load(self, bucket_refs: list, version: int, targets: list[int]) -> SyncOutcome:
        calls = {rid: self.replicas[rid].update_weights(bucket_refs, version) for rid in targets}
        return self._collect(calls, version, SyncOutcome())

    def _collect(self, calls: dict[int, Any], version: int, out: SyncOutcome) -> SyncOutcome:
        for rid, call in calls.items():
            try:
                out.receipts[rid] = call.result()
            except PeerDied as e:
                out.dead.append((rid, describe_failure(e)))
                continue
            self.loaded[rid] = version
            self.waiting.discard(rid)
            if rid in self.down and not any(v[0] == rid for v in self._starting.values()):
                self.down.discard(rid)
                out.joined.append(rid)
        return out

    def signal(self, rids: list[int], method: str, *args: Any) -> list:
        """Call `abort` / `resume` (with `args`) on the given live slots; returns the pending calls (a dead one is
        noticed elsewhere)."""
        return [getattr(self.replicas[rid], method)(*args) for rid in rids if rid not in self.down]

