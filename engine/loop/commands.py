"""Commands the loop cores return to their shell (the Ray actors, or the simulator).

A command is a request to do I/O: send requests to a replica, abort or resume replicas, put a finished group
into the queue, pull groups, train a batch, push weights, cut a checkpoint, record an event. The shell
carries each one out and reports the outcome back as an event (e.g. `RolloutLoop.group_put` after a `Put`,
`TrainerLoop.trained` after a `Train`). The first block is the rollouter's, the second the trainer's;
`AckKnob` and `Event` are both's; `SetThreads` is the elastic-cores core's (`engine.loop.elastic`).
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
    """Every validation answer of `version` is in: score them and record the metrics. Multi-turn: each result
    is the whole conversation (model turns and tool answers), and `turns` / `tool_calls` count, per result,
    its model turns and the tool calls it ran (empty for single-turn)."""

    version: int
    results: tuple[GenResult, ...]
    turns: tuple[int, ...] = ()
    tool_calls: tuple[int, ...] = ()


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
    validation: bool = False
    """A validation conversation's calls (answered with `tools_done(..., validation=True)`)."""


@dataclass(frozen=True)
class ReleaseTools:
    """Multi-turn: these trajectories (`(uid, index, validation)`) ended — finished, dropped, or the rollouter
    stopped — and had called tools: end their stateful tools' instances (release, then kill their boxes)."""

    trajectories: tuple[tuple[str, int, bool], ...]


@dataclass(frozen=True)
class Event:
    """An event for events.jsonl (`kind`, `level`, `message`, extra fields)."""

    level: str
    kind: str
    message: str
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class NeedPrompts:
    """The prompt stream needs epoch `epoch`'s prompts (in their seeded order): load them and report
    `RolloutLoop.prompts_loaded(epoch, prompts)` (an empty list: the data is exhausted)."""

    epoch: int


@dataclass(frozen=True)
class AckKnob:
    """A knob change (`engine.loop.knobs`) is applied: acknowledge `version` of `name` to the controller."""

    name: str
    version: int


# ---------------------------------------------------------------------------------------- the trainer's


@dataclass(frozen=True)
class PollControl:
    """Read the controller's knob table and the trainer's queued actions; report `TrainerLoop.control`."""


@dataclass(frozen=True)
class Pull:
    """Take up to `n` groups from the queue (waiting a little); report `TrainerLoop.pulled(groups, closed)`."""

    n: int


@dataclass(frozen=True)
class Drop:
    """These pulled groups are not trained (`reason`: "stale" — past the hard staleness cap — or "filtered" —
    no reward variance under dynamic sampling): ledger, release from the rollout budget, event."""

    groups: tuple[Any, ...]
    reason: str


@dataclass(frozen=True)
class Train:
    """One local step on these groups; report `TrainerLoop.trained()` (or `failed(...)` when it raised)."""

    groups: tuple[Any, ...]


@dataclass(frozen=True)
class AskOutstanding:
    """Report the oldest version feeding queued or in-flight work: `TrainerLoop.outstanding(v | None)`."""


@dataclass(frozen=True)
class Allow:
    """A sync is postponed (`stale_policy = "wait"`): the rollouter may admit the `need` prompts the next
    step lacks (`RolloutLoop.allow`)."""

    need: int


@dataclass(frozen=True)
class Sync:
    """Push the weights of `version` to the replicas (`begin_sync` … `finish_sync` on the rollouter). `cut`:
    snapshot the rollout side while it is paused, for the `Checkpoint("periodic")` that follows; `held`: the groups the trainer holds pulled and
    not yet trained, which carry over into the new version's budget as the queued and in-flight ones do
    (`RolloutLoop.finish_sync`; non-zero when a lowered interval makes a sync due while a batch is half pulled).
    Report `TrainerLoop.synced()`."""

    version: int
    cut: bool
    held: int = 0


@dataclass(frozen=True)
class Checkpoint:
    """Write a checkpoint (`reason`: periodic, on_demand, stop, final, failure); report
    `TrainerLoop.checkpointed()` (a failed write is reported too: the previous checkpoint stays)."""

    reason: str


@dataclass(frozen=True)
class Record:
    """The step's record is complete: publish it with these loop fields (`decision`: the sync decision after
    the step: none, sync or postpone)."""

    step: int
    version: int
    sync_interval: int
    staleness_bound: float
    decision: str


@dataclass(frozen=True)
class Finish:
    """The training loop is over: report the final weights; with `validate`, validate the last version."""

    validate: bool


# ---------------------------------------------------------------------------------- elastic cores


@dataclass(frozen=True)
class SetThreads:
    """`role` ("trainer": each trainer rank; "rollout": each replica) computes with `threads` intra-op threads
    from its next boundary on (the trainer: its next local step; a replica: its next decode step). Issued by
    `engine.loop.elastic.ElasticCores`; the shell applies `torch.set_num_threads(threads)` in the thread that
    computes, at that boundary."""

    role: str
    threads: int


Command = (Dispatch | Abort | Resume | Put | CloseQueue | SetQueueBound | ValidationDone | NeedPrompts | CallTools | Event
           | AckKnob | PollControl | Pull | Drop | Train | AskOutstanding | Allow | Sync | Checkpoint
           | Record | Finish | SetThreads)


@dataclass(frozen=True)
class ExitProcess:
    """Fault injection (`engine.loop.faults.FaultPlan`): end the shell's process now with exit `code`, as a crash
    would (no cleanup, no checkpoint); `reason` names the fault."""

    code: int
    reason: str
