"""The peers of `engine.runtime.peers` over Ray actor handles: what the shells did inline before, one call each.

A value-returning method is `ray.get(actor.method.remote(...))` (no deadline, as before), a fire-and-forget one is
`.remote()` alone, a `Pending` wraps the object ref (`RayPending`: `result(timeout)` is `ray.get(ref, timeout=)`,
`done()` is `ray.wait(timeout=0)`). A dead actor (`RayActorError` that is not a task's own error) becomes
`PeerDied`; `GetTimeoutError` is a `TimeoutError` already.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import ray

from engine.runtime.peers import PeerDied, PeerError, RolloutPeers, TrainerPeers, describe_failure
from engine.types import TrajectoryGroup

if TYPE_CHECKING:
    from engine.plan.roles import RolloutSpec


def dead_or_raise(e: BaseException) -> BaseException:
    """`PeerDied` for an actor whose process died, else `e` itself (a task's own error, a timeout)."""
    if isinstance(e, ray.exceptions.RayActorError) and not isinstance(e, ray.exceptions.RayTaskError):
        return PeerDied(describe_failure(e))
    return e


class RayPending:
    """A Ray call under way (`engine.runtime.peers.Pending`)."""

    def __init__(self, ref: Any) -> None:
        self.ref = ref

    def result(self, timeout: float | None = None) -> Any:
        try:
            return ray.get(self.ref, timeout=timeout)
        except ray.exceptions.RayActorError as e:
            raise dead_or_raise(e) from e

    def done(self) -> bool:
        return bool(ray.wait([self.ref], timeout=0)[0])


class RayQueue:
    """`QueuePeer` over the `MessageQueue` actor."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor

    def put(self, group: TrajectoryGroup) -> TrajectoryGroup | None:
        return ray.get(self.actor.put.remote(group))

    def get_batch(self, n: int, timeout: float) -> tuple[list[TrajectoryGroup], bool]:
        return ray.get(self.actor.get_batch.remote(n, timeout))

    def size(self) -> int:
        return ray.get(self.actor.size.remote())

    def min_version(self) -> int | None:
        return ray.get(self.actor.min_version.remote())

    def drain(self) -> list[TrajectoryGroup]:
        try:
            return ray.get(self.actor.drain.remote())
        except ray.exceptions.RayError as e:
            raise PeerError(f"the queue is unreachable: {type(e).__name__}") from e

    def peek_all(self) -> list[TrajectoryGroup]:
        return ray.get(self.actor.peek_all.remote())

    def close(self) -> None:
        ray.get(self.actor.close.remote())

    def set_max_size(self, max_size: int) -> None:
        ray.get(self.actor.set_max_size.remote(max_size))

    def set_max_size_later(self, max_size: int) -> None:
        self.actor.set_max_size.remote(max_size)


class RayController:
    """`ControllerPeer` over the `RunController` actor."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor

    def get_knobs(self, timeout: float | None = None) -> dict[str, dict[str, Any]]:
        return RayPending(self.actor.get_knobs.remote()).result(timeout)  # GetTimeoutError is a TimeoutError

    def take_actions(self, consumer: str, step: int | None = None, timeout: float | None = None) -> list[str]:
        return RayPending(self.actor.take_actions.remote(consumer, step)).result(timeout)

    def ack_knob(self, name: str, version: int, step: int | None) -> RayPending:
        return RayPending(self.actor.ack_knob.remote(name, version, step))

    def record_event(self, event: dict[str, Any]) -> None:
        self.actor.record_event.remote(event)

    def record_metrics(self, record: dict[str, Any]) -> None:
        self.actor.record_metrics.remote(record)

    def update_worker(self, worker_id: str, info: dict[str, Any]) -> None:
        self.actor.update_worker.remote(worker_id, info)


class RayRollouter:
    """`RollouterPeer` over the `Rollouter` actor."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor

    def trainer_phase(self, computing: bool, seq: int) -> RayPending:
        return RayPending(self.actor.trainer_phase.remote(computing, seq))

    def outstanding_min_version(self) -> int | None:
        return ray.get(self.actor.outstanding_min_version.remote())

    def allow(self, need: int) -> None:
        ray.get(self.actor.allow.remote(need))

    def release(self, uids: list[str], reason: str) -> None:
        self.actor.release.remote(uids, reason)

    def final_validation(self, version: int, step: int) -> None:
        ray.get(self.actor.final_validation.remote(version, step))

    def report(self, step: int | None = None) -> dict[str, Any]:
        return ray.get(self.actor.report.remote(step))

    def stop(self) -> dict[str, Any]:
        try:
            return ray.get(self.actor.stop.remote())
        except ray.exceptions.RayError as e:
            raise PeerError(f"the rollouter is unreachable: {type(e).__name__}") from e

    def snapshot(self, drain: bool = True) -> dict[str, Any]:
        return ray.get(self.actor.snapshot.remote(drain))

    def sync_generation(self) -> tuple[int, list[int] | None]:
        return ray.get(self.actor.sync_generation.remote())

    def update_weights(self, version: int, bucket_refs: list, step: int, snapshot: bool = False,
                       held: int = 0) -> RayPending:
        return RayPending(self.actor.update_weights.remote(version, bucket_refs, step, snapshot, held))

    def load_weights(self, version: int, bucket_refs: list) -> RayPending:
        return RayPending(self.actor.load_weights.remote(version, bucket_refs))

    def catch_up_slots(self) -> list[int]:
        return ray.get(self.actor.catch_up_slots.remote())

    def catch_up(self, version: int, bucket_refs: list, slots: list[int]) -> RayPending:
        return RayPending(self.actor.catch_up.remote(version, bucket_refs, slots))

    def replacements_starting(self) -> int:
        return ray.get(self.actor.replacements_starting.remote())


class RayProcess:
    """`ProcessPeer` of an actor's process: `exit` ends it at once (no cleanup, as a crash would)."""

    def exit(self, code: int, reason: str) -> None:
        os._exit(code)


def trainer_peers(queue: Any, rollouter: Any, controller: Any) -> TrainerPeers:
    """Trainer rank 0's peers from the actor handles the driver passes it."""
    return TrainerPeers(RayQueue(queue), RayRollouter(rollouter), RayController(controller), RayProcess(), ray.put,
                        ray.util.get_node_ip_address)


class RayReplica:
    """`ReplicaPeer` over a `RolloutReplica` actor: each method `.remote()`s and returns the `RayPending`."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor

    def _call(self, method: str, *args: Any) -> RayPending:
        return RayPending(getattr(self.actor, method).remote(*args))

    def ready(self) -> RayPending:
        return self._call("ready")

    def limits(self) -> RayPending:
        return self._call("limits")

    def generate(self, requests: list, sampling: Any, kind: str = "train") -> RayPending:
        return self._call("generate", requests, sampling, kind)

    def abort(self, validation: bool = False) -> RayPending:
        return self._call("abort", validation)

    def resume(self) -> RayPending:
        return self._call("resume")

    def update_weights(self, bucket_refs: list, version: int) -> RayPending:
        return self._call("update_weights", bucket_refs, version)

    def stages_weights(self) -> RayPending:
        return self._call("stages_weights")

    def stage_weights(self, bucket_refs: list, version: int) -> RayPending:
        return self._call("stage_weights", bucket_refs, version)

    def swap_weights(self, version: int) -> RayPending:
        return self._call("swap_weights", version)

    def set_threads(self, n: int) -> RayPending:
        return self._call("set_threads", n)

    def threads(self) -> RayPending:
        return self._call("threads")

    def debug_exit(self) -> RayPending:
        return self._call("debug_exit")


def ray_wait(pendings: list, timeout: float) -> list:
    """`engine.runtime.peers.Wait` over `RayPending`s: `ray.wait` for the first, then every other one done."""
    if not pendings:
        return []
    by_ref = {p.ref: p for p in pendings}
    ready, rest = ray.wait(list(by_ref), num_returns=1, timeout=timeout)
    if ready and rest:
        more, _ = ray.wait(rest, num_returns=len(rest), timeout=0)
        ready += more
    return [by_ref[r] for r in ready]


def rollout_peers(spec: RolloutSpec, queue: Any, controller: Any, replicas: list[Any]) -> RolloutPeers:
    """The rollouter's peers from the actor handles the driver passes it; replacements are started from the spec's
    replica part and Ray options (`spec.replica_options`; none: no restarts)."""
    spawn = None
    if spec.replica_options is not None:
        def spawn(rid: int) -> RayReplica:
            from engine.runtime.actors import RolloutReplica

            opts = spec.replica_options
            opts = opts[rid] if isinstance(opts, list) else opts  # per slot: its bundles
            return RayReplica(RolloutReplica.options(**opts).remote(spec.replica, rid))

    return RolloutPeers(RayQueue(queue), RayController(controller), [RayReplica(r) for r in replicas], spawn,
                        ray_wait)
