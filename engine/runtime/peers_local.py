"""The peers of `engine.runtime.peers` in one process, without Ray: plain objects called directly.

- the queue is the real `MessageQueueCore` (thread-safe; it is the `QueuePeer` interface itself, plus
  `set_max_size_later`, run at once);
- the controller is a `ControllerCore` (thread-safe) behind `LocalController`;
- the rollouter is a `RolloutShell` (or any object with its methods) behind `LocalRollouter`;
- a replica is a `ReplicaShell` (the real replica's body: its backend, tokenizer, weight loads) behind
  `LocalReplica`; its `debug_exit` marks it dead instead of ending the process (its calls fail `PeerDied`).

A call whose Ray version is asynchronous (it returns a `Pending`) runs on a thread of the peer's
`ThreadPoolExecutor` and returns its `concurrent.futures.Future`, so the caller's deadline means what it means
under Ray (a peer that never answers times the caller out instead of blocking it). Fire-and-forget calls run at
once on the caller's thread (cheap, and in the caller's order). The object store is a pickled copy
(`store_copy`): what a sender puts is the store's, whatever the sender does with its buffers afterwards.
"""

from __future__ import annotations

import pickle
import threading
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from typing import Any

from engine.loop.dispatch import STREAM_CALLS
from engine.runtime.peers import PeerDied, ProcessExit, RolloutPeers, TrainerPeers
from engine.runtime.queue import MessageQueueCore


def answered(value: Any) -> Future:
    """A `Future` that already holds `value`."""
    f: Future = Future()
    f.set_result(value)
    return f


def store_copy(obj: Any) -> Any:
    """The in-process object store's `put`: the object as the store keeps it (a serialised copy, as `ray.put`)."""
    return pickle.loads(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


class LocalQueue(MessageQueueCore):
    """The real `MessageQueueCore` as the `QueuePeer`."""

    def set_max_size_later(self, max_size: int) -> None:
        self.set_max_size(max_size)


class _Threads:
    """A peer's executor for the calls that are asynchronous under Ray; `close()` lets its threads end."""

    def __init__(self, name: str, workers: int = 4) -> None:
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)

    def later(self, fn: Any, *args: Any) -> Future:
        return self.pool.submit(fn, *args)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


class LocalController(_Threads):
    """`ControllerPeer` over a `ControllerCore` in this process (`ack_knob` answers on a thread of its own)."""

    def __init__(self, core: Any) -> None:
        super().__init__("controller")
        self.core = core

    def get_knobs(self, timeout: float | None = None) -> dict[str, dict[str, Any]]:
        return self.later(self.core.get_knobs).result(timeout)  # concurrent.futures' TimeoutError is TimeoutError

    def take_actions(self, consumer: str, step: int | None = None, timeout: float | None = None) -> list[str]:
        return self.later(self.core.take_actions, consumer, step).result(timeout)

    def ack_knob(self, name: str, version: int, step: int | None) -> Future:
        return self.later(self.core.ack_knob, name, version, step)

    def record_event(self, event: dict[str, Any]) -> None:
        self.core.record_event(event)

    def record_metrics(self, record: dict[str, Any]) -> None:
        self.core.record_metrics(record)

    def update_worker(self, worker_id: str, info: dict[str, Any]) -> None:
        self.core.update_worker(worker_id, info)


class LocalRollouter(_Threads):
    """`RollouterPeer` over a rollouter shell in this process: the weight loads and the elastic answer run on the
    peer's threads (asynchronous under Ray), the rest is called directly."""

    def __init__(self, shell: Any) -> None:
        super().__init__("rollouter")
        self.shell = shell

    def trainer_phase(self, computing: bool, seq: int) -> Future:
        return self.later(self.shell.trainer_phase, computing, seq)

    def outstanding_min_version(self) -> int | None:
        return self.shell.outstanding_min_version()

    def allow(self, need: int) -> None:
        self.shell.allow(need)

    def release(self, uids: list[str], reason: str) -> None:
        self.shell.release(uids, reason)

    def final_validation(self, version: int, step: int) -> None:
        self.shell.final_validation(version, step)

    def report(self, step: int | None = None) -> dict[str, Any]:
        return self.shell.report(step)

    def stop(self) -> dict[str, Any]:
        return self.shell.stop()

    def snapshot(self, drain: bool = True) -> dict[str, Any]:
        return self.shell.snapshot(drain)

    def sync_generation(self) -> tuple[int, list[int] | None]:
        return self.shell.sync_generation()

    def update_weights(self, version: int, bucket_refs: list, step: int, snapshot: bool = False,
                       held: int = 0) -> Future:
        return self.later(self.shell.update_weights, version, bucket_refs, step, snapshot, held)

    def load_weights(self, version: int, bucket_refs: list) -> Future:
        return self.later(self.shell.load_weights, version, bucket_refs)

    def catch_up_slots(self) -> list[int]:
        return self.shell.catch_up_slots()

    def catch_up(self, version: int, bucket_refs: list, slots: list[int]) -> Future:
        return self.later(self.shell.catch_up, version, bucket_refs, slots)

    def replacements_starting(self) -> int:
        return self.shell.replacements_starting()


class LocalProcess:
    """`ProcessPeer` that records each exit and unwinds the shell with `ProcessExit` instead of ending the process."""

    def __init__(self) -> None:
        self.exits: list[tuple[int, str]] = []

    def exit(self, code: int, reason: str) -> None:
        self.exits.append((code, reason))
        raise ProcessExit(code, reason)


def trainer_peers(queue: Any, rollouter: Any, controller: Any) -> TrainerPeers:
    """Trainer rank 0's peers in this process: `queue` a `LocalQueue`, `rollouter` a rollouter shell (or an object
    with its methods; or its `LocalRollouter`), `controller` a `ControllerCore` (or its `LocalController`)."""
    ctl = controller if isinstance(controller, LocalController) else LocalController(controller)
    rol = rollouter if isinstance(rollouter, LocalRollouter) else LocalRollouter(rollouter)
    return TrainerPeers(queue, rol, ctl, LocalProcess(), store_copy, lambda: "127.0.0.1")


class LocalReplica(_Threads):
    """`ReplicaPeer` over a replica shell in this process: every call runs on the peer's threads (as many as the Ray
    actor has, `engine.runtime.replica.MAX_CONCURRENCY`). Once it is dead (`debug_exit`, or `kill`), a call fails
    with `PeerDied` — one that was running when it died too, as Ray fails the calls of a dead actor."""

    def __init__(self, shell: Any, workers: int = STREAM_CALLS + 4) -> None:
        super().__init__("replica", workers)
        self.shell = shell
        self._dead = threading.Event()

    def kill(self) -> None:
        self._dead.set()

    def _call(self, method: str, *args: Any) -> Future:
        def run() -> Any:
            if self._dead.is_set():
                raise PeerDied("its process died (killed)")
            out = getattr(self.shell, method)(*args)
            if self._dead.is_set():
                raise PeerDied("its process died (killed)")
            return out

        return self.later(run)

    def ready(self) -> Future:
        return self._call("ready")

    def limits(self) -> Future:
        return self._call("limits")

    def generate(self, requests: list, sampling: Any, kind: str = "train") -> Future:
        return self._call("generate", requests, sampling, kind)

    def abort(self, validation: bool = False) -> Future:
        return self._call("abort", validation)

    def resume(self) -> Future:
        return self._call("resume")

    def update_weights(self, bucket_refs: list, version: int) -> Future:
        return self._call("update_weights", bucket_refs, version)

    def stages_weights(self) -> Future:
        return self._call("stages_weights")

    def stage_weights(self, bucket_refs: list, version: int) -> Future:
        return self._call("stage_weights", bucket_refs, version)

    def swap_weights(self, version: int) -> Future:
        return self._call("swap_weights", version)

    def set_threads(self, n: int) -> Future:
        return self._call("set_threads", n)

    def threads(self) -> Future:
        return self._call("threads")

    def debug_exit(self) -> Future:
        self.kill()
        f: Future = Future()
        f.set_exception(PeerDied("its process died (debug_exit)"))
        return f


def local_wait(pendings: list, timeout: float) -> list:
    """`engine.runtime.peers.Wait` over `Future`s: the first done (at most `timeout` s), then every other one done."""
    if not pendings:
        return []
    done, _ = futures_wait(pendings, timeout=timeout, return_when=FIRST_COMPLETED)
    return [p for p in pendings if p in done or p.done()]


def rollout_peers(queue: Any, controller: Any, replicas: list[Any],
                  spawn: Callable[[int], Any] | None = None) -> RolloutPeers:
    """The rollouter's peers in this process: `queue` a `LocalQueue`, `controller` a `ControllerCore` (or the
    `LocalController` the trainer's peers share), `replicas` replica shells (or `LocalReplica`s), `spawn(rid)` a
    replacement replica shell (None: no restarts)."""
    ctl = controller if isinstance(controller, LocalController) else LocalController(controller)
    reps = [r if isinstance(r, LocalReplica) else LocalReplica(r) for r in replicas]
    respawn = (lambda rid: LocalReplica(spawn(rid))) if spawn is not None else None
    return RolloutPeers(queue, ctl, reps, respawn, local_wait)
