"""The peers a shell talks to, as typed interfaces: the shells (`engine.runtime.trainer_actor.TrainerCore`,
`engine.runtime.rollouter.RolloutShell`) call these and never Ray, so the same shell runs against Ray actors
(`engine.runtime.peers_ray`) or against plain objects in one process (`engine.runtime.peers_local`: the real
`MessageQueueCore`, `ControllerCore` and shells, for tests that start no Ray).

The calling protocol, the same in both implementations:
- a method that returns a value waits for the peer's answer (Ray: `ray.get` without a deadline, as before);
- a method that returns `None` and says "not waited for" is fire-and-forget (Ray: `.remote()` only). An
  in-process peer runs it at once; its order relative to the caller's other calls is kept in both;
- a method that returns a `Pending` starts the call and returns at once; `result(timeout)` waits for it, and raises
  `TimeoutError` when the deadline passes first (Ray's `GetTimeoutError` is one), `done()` asks without waiting.
  Each deadline a shell uses is its own constant (`CONTROLLER_ANSWER_S`, `ELASTIC_ANSWER_S`, ...), unchanged;
- a peer whose process died raises `PeerDied` (Ray: `RayActorError` of a dead actor); a call that failed in the
  transport in any other way raises `PeerError` where the shell tolerates it. An exception the peer's own code
  raised reaches the caller as it is.

The trainer's peers are `TrainerPeers`: the queue, the rollouter, the controller, an object store for the weight
buckets of the object-store transport (`engine.sync.object_store.ObjectStoreSync`), and the process itself
(fault injection ends it: `ProcessPeer.exit`). The rollouter's are `RolloutPeers`: the queue, the controller, the
replicas (each call a `Pending`), how to start a replacement replica, and `wait` for the first of several calls.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from engine.types import TrajectoryGroup

T = TypeVar("T", covariant=True)


class PeerError(RuntimeError):
    """A call to a peer failed in the transport (Ray: a `RayError`), not in the peer's own code."""


class PeerDied(PeerError):
    """The peer's process is gone (Ray: `RayActorError` of an actor whose process died). `cause`: one line."""

    def __init__(self, cause: str) -> None:
        super().__init__(cause)
        self.cause = cause


class Pending(Protocol[T]):
    """A call under way (`concurrent.futures.Future` is one; Ray's is `peers_ray.RayPending`)."""

    def result(self, timeout: float | None = None) -> T:
        """The answer, waiting at most `timeout` s (None: without a deadline); `TimeoutError` past it."""
        ...

    def done(self) -> bool:
        """Whether the answer (or the failure) is there, without waiting."""
        ...


class QueuePeer(Protocol):
    """The bounded `MessageQueue` (the methods of `engine.runtime.queue.MessageQueueCore`; in one process the
    peer is that class itself, `peers_local.LocalQueue`): the rollouter puts, the trainer pulls."""

    def put(self, group: TrajectoryGroup) -> TrajectoryGroup | None: ...
    def get_batch(self, n: int, timeout: float) -> tuple[list[TrajectoryGroup], bool]: ...
    def size(self) -> int: ...
    def min_version(self) -> int | None: ...
    def drain(self) -> list[TrajectoryGroup]: ...
    def peek_all(self) -> list[TrajectoryGroup]: ...
    def close(self) -> None: ...
    def set_max_size(self, max_size: int) -> None: ...

    def set_max_size_later(self, max_size: int) -> None:
        """`set_max_size`, not waited for (`SetQueueBound` of the rollout core)."""
        ...


class ControllerPeer(Protocol):
    """The run's controller (`engine.control.core.ControllerCore`): knobs and actions are read and acknowledged,
    metrics, events and worker states pushed."""

    def get_knobs(self, timeout: float | None = None) -> dict[str, dict[str, Any]]:
        """Waited for, at most `timeout` seconds (None: no deadline); then `TimeoutError`."""
        ...

    def take_actions(self, consumer: str, step: int | None = None, timeout: float | None = None) -> list[str]:
        """Waited for, at most `timeout` seconds (None: no deadline); then `TimeoutError`."""
        ...

    def ack_knob(self, name: str, version: int, step: int | None) -> Pending[Any]:
        """The knob change is in force: the trainer waits for the answer (with a deadline), the rollouter not."""
        ...

    def record_event(self, event: dict[str, Any]) -> None:
        """Not waited for."""
        ...

    def record_metrics(self, record: dict[str, Any]) -> None:
        """Not waited for."""
        ...

    def update_worker(self, worker_id: str, info: dict[str, Any]) -> None:
        """Not waited for."""
        ...


class RollouterPeer(Protocol):
    """The rollouter as the trainer calls it (`engine.runtime.rollouter.RolloutShell`'s methods of the same names)."""

    def trainer_phase(self, computing: bool, seq: int) -> Pending[int]:
        """Elastic cores: the answer is the trainer's thread count (waited for only when `computing`)."""
        ...

    def outstanding_min_version(self) -> int | None: ...
    def allow(self, need: int) -> None: ...

    def release(self, uids: list[str], reason: str) -> None:
        """Not waited for."""
        ...

    def final_validation(self, version: int, step: int) -> None: ...
    def report(self, step: int | None = None) -> dict[str, Any]: ...

    def stop(self) -> dict[str, Any]:
        """`PeerError` when the rollouter is unreachable (the run is failing anyway)."""
        ...

    def snapshot(self, drain: bool = True) -> dict[str, Any]: ...
    def sync_generation(self) -> tuple[int, list[int] | None]: ...

    def update_weights(self, version: int, bucket_refs: list, step: int, snapshot: bool = False,
                       held: int = 0) -> Pending[dict[str, Any]]:
        """Started while the trainer still sends the buckets; the answer carries the receipts."""
        ...

    def load_weights(self, version: int, bucket_refs: list) -> Pending[dict[int, Any]]: ...
    def catch_up_slots(self) -> list[int]: ...
    def catch_up(self, version: int, bucket_refs: list, slots: list[int]) -> Pending[dict[int, Any]]: ...
    def replacements_starting(self) -> int: ...


class ReplicaPeer(Protocol):
    """One rollout replica (`engine.runtime.replica.ReplicaShell`'s methods): every call is started and returns a
    `Pending` (several `generate` calls are out at once; control calls land while they run)."""

    def ready(self) -> Pending[int]: ...
    def limits(self) -> Pending[dict[str, int]]: ...
    def generate(self, requests: list, sampling: Any, kind: str = "train") -> Pending[list]: ...
    def abort(self, validation: bool = False) -> Pending[None]: ...
    def resume(self) -> Pending[None]: ...
    def update_weights(self, bucket_refs: list, version: int) -> Pending[dict[str, Any]]: ...
    def stages_weights(self) -> Pending[bool]: ...
    def stage_weights(self, bucket_refs: list, version: int) -> Pending[dict[str, Any]]: ...
    def swap_weights(self, version: int) -> Pending[dict[str, Any]]: ...
    def set_threads(self, n: int) -> Pending[None]: ...
    def threads(self) -> Pending[dict[str, float]]: ...

    def debug_exit(self) -> Pending[None]:
        """Fault injection (`debug.kill_replica_at_step`): the replica's process ends; its calls fail `PeerDied`."""
        ...


Wait = Callable[[list, float], list]
"""`wait(pendings, timeout)`: those of `pendings` that are done — waiting until the first one is, at most `timeout`
s, then taking every other one done by then (Ray: `ray.wait`; in-process: `concurrent.futures.wait`)."""


class ProcessPeer(Protocol):
    """The shell's own process: fault injection ends it (Ray: `os._exit`, the process dies mid-run; in-process: the
    exit is recorded and `ProcessExit` unwinds the shell, so a test observes it and lives)."""

    def exit(self, code: int, reason: str) -> None: ...


class ProcessExit(BaseException):
    """An in-process peer's stand-in for a process that ended (not an `Exception`: a shell's failure handling, which
    a dead process never runs, does not catch it)."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(f"process exit {code}: {reason}")
        self.code, self.reason = code, reason


@dataclass(frozen=True)
class TrainerPeers:
    """What trainer rank 0 talks to. `put`: the object store the object-store weight transport puts each bucket
    into (Ray: `ray.put`; in-process: a pickled copy, as the store holds a copy). `node_ip()`: this node's address,
    where the collective and shared-memory transports meet (Ray: `ray.util.get_node_ip_address`; in-process:
    127.0.0.1)."""

    queue: QueuePeer
    rollouter: RollouterPeer
    controller: ControllerPeer
    process: ProcessPeer
    put: Callable[[Any], Any]
    node_ip: Callable[[], str]


@dataclass(frozen=True)
class RolloutPeers:
    """What the rollouter talks to: the queue, the controller, its replicas (slot i: replica i), `spawn(rid)` a
    replacement replica for slot `rid` (None: the run has no restarts) and `wait` over replica calls."""

    queue: QueuePeer
    controller: ControllerPeer
    replicas: list[ReplicaPeer]
    spawn: Callable[[int], ReplicaPeer] | None
    wait: Wait


def describe_failure(e: BaseException) -> str:
    """One line naming why a peer's call failed: for a dead peer "its process died (<Ray's exit detail>)", else the
    root exception of a task error or of a failed constructor (the last line of its message)."""
    if isinstance(e, PeerDied):
        return e.cause
    ray = sys.modules.get("ray")  # no Ray error exists in a process that never imported Ray
    exc = getattr(ray, "exceptions", None) if ray is not None else None
    dead = exc is not None and isinstance(e, exc.RayActorError) and not isinstance(e, exc.RayTaskError)
    if dead and not getattr(e, "actor_init_failed", False):
        text = " ".join(str(e).split())
        detail = text.split("Worker exit detail:", 1)[1].split(". ", 1)[0].strip() \
            if "Worker exit detail:" in text else ""
        return f"its process died ({detail[:160]})" if detail else "its process died"
    cause = getattr(e, "cause", None) or e
    lines = [ln.strip() for ln in str(cause).splitlines() if ln.strip()]
    return (lines[-1] if lines else type(cause).__name__)[:200]
