"""The Ray actors of the loop: thin wrappers that build each shell's Ray peers (`engine.runtime.peers_ray`) from
the actor handles the driver passes and run the shell. The shells themselves (`engine.runtime.queue`,
`engine.runtime.replica`, `engine.runtime.rollouter`, `engine.runtime.trainer_actor`) import no Ray, so they run in
one process against the in-process peers (`engine.runtime.peers_local`, `tests/runtime`)."""

from __future__ import annotations

import os
from typing import Any

import ray

from engine.plan.roles import RolloutSpec, TrainerSpec
from engine.runtime.queue import MessageQueueCore
from engine.runtime.replica import MAX_CONCURRENCY, ReplicaShell
from engine.runtime.rollouter import RolloutShell


@ray.remote(num_cpus=0, max_concurrency=8)
class MessageQueue(MessageQueueCore):
    """The queue as a Ray actor (threaded, so a blocking `get_batch` does not block `put`)."""


@ray.remote(max_concurrency=MAX_CONCURRENCY)
class RolloutReplica(ReplicaShell):
    """One rollout replica as a threaded Ray actor (`ReplicaShell`): `generate` calls run at once beside the control
    calls."""


@ray.remote(num_cpus=0, max_concurrency=8)
class Rollouter(RolloutShell):
    """The rollouter as a threaded Ray actor: `fit()` runs the dispatch loop while the trainer calls in; its peers
    are the queue, controller and replica actors (`peers_ray.rollout_peers`)."""

    def __init__(self, spec: RolloutSpec, queue: Any, controller: Any, replicas: list[Any]) -> None:
        from engine.runtime.peers_ray import rollout_peers

        super().__init__(spec, rollout_peers(spec, queue, controller, replicas))


@ray.remote(max_concurrency=2)
class Trainer:
    """Thin actor around `TrainerCore` (rank 0 of the trainer; the spec's `rank_options` place the other ranks)."""

    def __init__(self, spec: TrainerSpec, queue: Any, rollouter: Any, controller: Any) -> None:
        import torch

        from engine.runtime.peers_ray import trainer_peers
        from engine.runtime.trainer_actor import TrainerCore

        torch.set_num_threads(max(1, spec.threads))
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        self.core = TrainerCore(spec, trainer_peers(queue, rollouter, controller))

    def fit(self) -> dict[str, Any]:
        return self.core.fit()

    def request_stop(self, reason: str, deadline: float | None = None, weight_bytes: int = 0) -> None:
        self.core.request_stop(reason, deadline, weight_bytes)

    def push_weights(self) -> None:
        """Resume: give the rollout replicas the restored version's weights before generation starts."""
        self.core.push_version()
