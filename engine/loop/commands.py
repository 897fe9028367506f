"""Commands the loop cores return to their shell (the Ray actors, or the simulator).

A command is a request to do I/O: send requests to a replica, abort or resume replicas, put a finished group
into the queue, record an event. The shell carries each one out and reports the outcome back as an event
(e.g. `RolloutLoop.group_put` after a `Put`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.types import GenRequest, GenResult, Prompt, Trajectory


@dataclass(frozen=True)
class Dispatch:
    """Send `requests` to replica `replica` (`kind`: "train" or "val", which selects the sampling params) as
    one call; a replica may run several at once. Report the answers with `generation_finished(replica,
    results, now, dispatch_id)`."""

    replica: int
    requests: tuple[GenRequest, ...]
    kind: str
    dispatch_id: int = 0


@dataclass(frozen=True)
class Abort:
    """Abort the running training generations of these replicas (all their calls) at their next token
    boundary, and any training call they get before `Resume`; with `validation` their validation calls too."""

    replicas: tuple[int, ...]
    validation: bool = False


@dataclass(frozen=True)
class Resume:
    """Let these replicas generate again after an `Abort`."""

    replicas: tuple[int, ...]


@dataclass(frozen=True)
class Put:
    """Score the `n` finished trajectories of `prompt` and put the group into the queue; report
    `group_put(evicted_uid)` back."""

    prompt: Prompt
    trajectories: tuple[Trajectory, ...]
    admitted_version: int
    admitted_at: float


@dataclass(frozen=True)
class CloseQueue:
    """The prompt stream is exhausted and every admitted prompt is finished."""


@dataclass(frozen=True)
class SetQueueBound:
    """The queue's bound changed (it follows the staleness budget's limit)."""

    size: int


@dataclass(frozen=True)
class ValidationDone:
    """Every validation answer of `version` is in: score them and record the metrics."""

    version: int
    results: tuple[GenResult, ...]


@dataclass(frozen=True)
class CallTools:
    """Multi-turn: run trajectory `index` of prompt `uid`'s tool `calls` (then `RolloutLoop.tools_done`);
    `errors` are the turn's malformed or surplus calls, answered with these texts."""

    uid: str
    index: int
    calls: tuple[Any, ...]
    errors: tuple[str, ...] = ()
    tools_kwargs: dict[str, Any] = field(default_factory=dict)
    """The prompt's `extra_info.tools_kwargs` (verl's layout: `{tool: {"create_kwargs": {...}}}`)."""


@dataclass(frozen=True)
class Event:
    """An event for events.jsonl (`kind`, `level`, `message`, extra fields)."""

    level: str
    kind: str
    message: str
    extra: dict[str, Any] = field(default_factory=dict)


Command = Dispatch | Abort | Resume | Put | CloseQueue | SetQueueBound | ValidationDone | CallTools | Event
