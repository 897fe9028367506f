"""The rollout replicas of a run, with replacement of dead ones under a failure budget.

A replica whose call raised `RayActorError` has lost its process. `fail(rid, cause)` marks it down and,
while fewer than `max_restarts` replacements were started over the run, starts a new actor in its slot
whose first call loads the newest weights the rollouter has seen (`set_latest`; before the first sync the
replacement's own base model is version 0). The slot is usable again once that call returns (`poll`); a
sync that lands meanwhile is caught up before the slot is released. A failure of the replacement itself
counts as one more failure. When the budget is spent `exhausted` holds the reason and nothing restarts.

The pool keeps references to the latest weight buckets, so they stay in the object store (one copy of the
model) until the next sync replaces them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ray


def describe_failure(e: BaseException) -> str:
    """One line naming why a Ray call failed: the root exception of a task error or of a failed constructor,
    or for an actor whose process died "its process died (<Ray's exit detail>)"."""
    dead = isinstance(e, ray.exceptions.RayActorError) and not isinstance(e, ray.exceptions.RayTaskError)
    if dead and not getattr(e, "actor_init_failed", False):
        text = " ".join(str(e).split())
        detail = text.split("Worker exit detail:", 1)[1].split(". ", 1)[0].strip() \
            if "Worker exit detail:" in text else ""
        return f"its process died ({detail[:160]})" if detail else "its process died"
    cause = getattr(e, "cause", None) or e
    lines = [ln.strip() for ln in str(cause).splitlines() if ln.strip()]
    return (lines[-1] if lines else type(cause).__name__)[:200]


class ReplicaPool:
    """Slots `0..R-1`, each holding the current actor of one replica."""

    def __init__(self, replicas: list[Any], spawn: Callable[[int], Any] | None, max_restarts: int) -> None:
        self.replicas = list(replicas)
        self.spawn = spawn
        self.max_restarts = max_restarts
        self.restarts = 0
        self.down: set[int] = set()
        self.latest: tuple[int, list] | None = None  # (version, bucket refs) of the newest weights
        self.exhausted: str | None = None
        self._starting: dict[Any, tuple[int, int]] = {}  # ready ref -> (slot, version being loaded)

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
        self._starting = {ref: v for ref, v in self._starting.items() if v[0] != rid}
        if self.spawn is None or self.restarts >= self.max_restarts:
            self.exhausted = (f"rollout replica {rid} died ({cause}) and the restart budget "
                              f"rollout.max_replica_restarts = {self.max_restarts} is spent")
            return False
        self.restarts += 1
        self.replicas[rid] = self.spawn(rid)
        self._load_latest(rid)
        return True

    def _load_latest(self, rid: int) -> None:
        actor = self.replicas[rid]
        if self.latest is None:
            self._starting[actor.ready.remote()] = (rid, 0)
        else:
            version, refs = self.latest
            self._starting[actor.update_weights.remote(refs, version)] = (rid, version)

    def poll(self) -> list[tuple[int, str | None]]:
        """Replacements whose start finished since the last poll: (slot, None) ready, (slot, cause) failed.
        A replacement that loaded weights older than `latest` is sent the newest first and reported later."""
        if not self._starting:
            return []
        ready, _ = ray.wait(list(self._starting), num_returns=len(self._starting), timeout=0)
        out: list[tuple[int, str | None]] = []
        for ref in ready:
            rid, loaded = self._starting.pop(ref)
            try:
                ray.get(ref)
            except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as e:
                out.append((rid, describe_failure(e)))
                continue
            if self.latest is not None and self.latest[0] > loaded:
                self._load_latest(rid)
                continue
            self.down.discard(rid)
            out.append((rid, None))
        return out

    def update_live(self, bucket_refs: list, version: int) -> list[tuple[int, str]]:
        """Load weights on every live replica; returns (slot, cause) for those that died meanwhile."""
        self.set_latest(version, bucket_refs)
        calls = {rid: self.replicas[rid].update_weights.remote(bucket_refs, version) for rid in self.live()}
        dead: list[tuple[int, str]] = []
        for rid, ref in calls.items():
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError as e:
                dead.append((rid, describe_failure(e)))
        return dead

    def signal(self, rids: list[int], method: str, *args: Any) -> list:
        """Call `abort` / `resume` (with `args`) on the given live slots; returns the refs (a dead one is
        noticed elsewhere)."""
        return [getattr(self.replicas[rid], method).remote(*args) for rid in rids if rid not in self.down]


def replica_spawner(cfg: Any, model_dir: str, spec: dict | None):
    """A function starting a replacement replica in slot `rid` (None without a spec: no restarts)."""
    if spec is None:
        return None

    def spawn(rid: int) -> Any:
        from engine.runtime.replica import RolloutReplica

        opts = spec["options"][rid] if isinstance(spec["options"], list) else spec["options"]  # per slot: its bundles
        return RolloutReplica.options(**opts).remote(cfg, model_dir, rid, spec["threads"], spec.get("device"))

    return spawn
