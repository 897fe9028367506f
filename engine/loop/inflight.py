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

from engine.loop.agent import AgentConversation, AgentLimits, TurnRecord
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
    convs: dict[int, AgentConversation] = field(default_factory=dict)  # multi-turn: each index's conversation
    tools: set[int] = field(default_factory=set)  # multi-turn: waiting for their tools' answers


def oldest_version(states: list[InFlight]) -> int | None:
    """Oldest policy version still feeding an unfinished prompt: its finished samples, its resumable prefixes
    and the version it was admitted under (for the `wait` stale policy)."""
    vs = [t.min_version for st in states for t in st.done.values()]
    vs += [r.min_version for st in states for r in st.pending.values() if r.min_version is not None]
    vs += [t.min_version for st in states for c in st.convs.values() for t in c.turns]
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
    out = {"prompt": asdict(st.prompt), "admitted_version": st.admitted_version,
           "done": {str(i): asdict(t) for i, t in st.done.items()}, "todo": todo}
    if st.convs:
        out["convs"] = {str(i): _conv_to_json(c) for i, c in st.convs.items() if i not in st.done}
    return out


def _conv_to_json(c: AgentConversation) -> dict[str, Any]:
    """A conversation's checkpoint form, cut back to the end of its last tool answer: a model turn under way
    (running, interrupted, or waiting for its tools) is generated again on resume, so the ledger stays exact
    and no answer is owed by a process that no longer exists."""
    turns = list(c.turns)
    cut = len(c.response_ids)
    if turns and turns[-1].end == cut:
        cut = turns.pop().start
    return {"response_ids": c.response_ids[:cut], "loss_mask": c.loss_mask[:cut],
            "rollout_log_probs": c.rollout_log_probs[:cut], "turns": [asdict(t) for t in turns],
            "user_turns": c.user_turns}


def next_turn_request(prompt: Prompt, index: int, conv: AgentConversation,
                      min_version: int | None = None) -> GenRequest:
    """The request that generates `conv`'s next model tokens (its prefix is the conversation so far;
    `min_version` only when it continues a turn interrupted by a sync)."""
    return GenRequest(request_id(prompt.uid, index), prompt.prompt_ids, prefix_ids=list(conv.response_ids),
                      prefix_log_probs=list(conv.rollout_log_probs), max_new_tokens=conv.turn_budget(),
                      min_version=min_version, images=prompt.images)


def conv_from_json(d: Mapping[str, Any], limits: AgentLimits) -> AgentConversation:
    return AgentConversation(limits, list(d["response_ids"]), list(d["loss_mask"]), list(d["rollout_log_probs"]),
                             [TurnRecord(**t) for t in d["turns"]], int(d["user_turns"]))


def in_flight_from_json(d: Mapping[str, Any], *, n: int, max_new_tokens: int, keep_prefixes: bool,
                        now: float, agent: AgentLimits | None = None) -> InFlight:
    """Rebuild an `InFlight` whose unfinished indices are all pending (nothing runs after a restore). A
    multi-turn index continues its saved conversation with its next model turn."""
    prompt = Prompt(**d["prompt"])
    st = InFlight(prompt, now, int(d["admitted_version"]))
    st.done = {int(i): Trajectory(**t) for i, t in d["done"].items()}
    saved = {int(i): GenRequest(**r) for i, r in d.get("todo", {}).items()}
    convs = d.get("convs", {})
    for i in range(n):
        if i in st.done:
            continue
        if agent is not None:
            c = st.convs[i] = conv_from_json(convs[str(i)], agent) if str(i) in convs else AgentConversation(agent)
            st.pending[i] = next_turn_request(prompt, i, c)
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
