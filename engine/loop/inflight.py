"""The rollout loop's per-prompt state and its checkpoint form.

An `InFlight` is one admitted prompt whose `n` trajectories are being generated: the finished ones (`done`),
the requests waiting for (re)dispatch (`pending`: new ones, or ones resumed from a prefix after a sync) and
the indices on a replica now (`running`). In a checkpoint every unfinished index is saved as the request to
re-issue: a pending request as it is (prefix, log-probs and the version of its first token included), a
running one as it was dispatched (what it generated since is not visible to the rollouter and is
regenerated). On restore the saved prefixes are kept when partial rollout is on; otherwise every unfinished
index starts again from the prompt with the full budget.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from engine.types import GenRequest, Prompt, Trajectory


@dataclass
class InFlight:
    """A prompt whose `n` trajectories are being generated."""

    prompt: Prompt
    admitted_at: float
    admitted_version: int
    done: dict[int, Trajectory] = field(default_factory=dict)
    pending: dict[int, GenRequest] = field(default_factory=dict)  # waiting for (re)dispatch
    running: set[int] = field(default_factory=set)  # on a replica now


def oldest_version(states: list[InFlight]) -> int | None:
    """Oldest policy version still feeding an unfinished prompt: its finished samples, its resumable prefixes
    and the version it was admitted under (for the `wait` stale policy)."""
    vs = [t.min_version for st in states for t in st.done.values()]
    vs += [r.min_version for st in states for r in st.pending.values() if r.min_version is not None]
    vs += [st.admitted_version for st in states]
    return min(vs, default=None)


def request_id(uid: str, index: int) -> str:
    """The id of trajectory `index` of prompt `uid` (`"{uid}#{index}"`)."""
    return f"{uid}#{index}"


def in_flight_to_json(st: InFlight, dispatched: Mapping[str, GenRequest]) -> dict[str, Any]:
    """The checkpoint form of `st`; `dispatched` maps request ids on a replica now to what was sent."""
    todo: dict[str, dict[str, Any]] = {str(i): asdict(r) for i, r in st.pending.items()}
    for i in st.running:
        sent = dispatched.get(request_id(st.prompt.uid, i))
        if sent is not None:
            todo[str(i)] = asdict(sent)
    return {"prompt": asdict(st.prompt), "admitted_version": st.admitted_version,
            "done": {str(i): asdict(t) for i, t in st.done.items()}, "todo": todo}


def in_flight_from_json(d: Mapping[str, Any], *, n: int, max_new_tokens: int, keep_prefixes: bool,
                        now: float) -> InFlight:
    """Rebuild an `InFlight` whose unfinished indices are all pending (nothing runs after a restore)."""
    prompt = Prompt(**d["prompt"])
    st = InFlight(prompt, now, int(d["admitted_version"]))
    st.done = {int(i): Trajectory(**t) for i, t in d["done"].items()}
    saved = {int(i): GenRequest(**r) for i, r in d.get("todo", {}).items()}
    for i in range(n):
        if i in st.done:
            continue
        req = saved.get(i)
        if req is None or not keep_prefixes or not req.prefix_ids:
            req = GenRequest(request_id(prompt.uid, i), prompt.prompt_ids, max_new_tokens=max_new_tokens)
        st.pending[i] = req
    return st


def in_flight_summary(states: list[InFlight]) -> dict[str, int]:
    """Counts for the resume event: prompts, unfinished trajectories, and those resumed from a prefix."""
    todo = [r for st in states for r in st.pending.values()]
    return {"prompts": len(states), "trajectories": len(todo),
            "with_prefix": sum(1 for r in todo if r.prefix_ids)}
