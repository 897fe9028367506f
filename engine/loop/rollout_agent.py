"""Multi-turn training trajectories in `RolloutLoop` (a mixin of it: uses its `p`, `in_flight`, `val_convs`,
`stopped`, `_val_tools_done`): a model turn's outcome, its tool calls out (`CallTools`) and their answers in
(`tools_done`), and the end of each trajectory's tools.

`ReleaseTools`: the core remembers the trajectories that called tools (`tool_users`: `(uid, index,
validation)`) and, when one ends — finished, dropped (`_drop`), its validation replaced, or the rollouter
stopped — emits `ReleaseTools` for it once, so the shell ends its stateful tools' instances
(`engine.agent.session`): no tool instance outlives its trajectory.
"""

from __future__ import annotations

from typing import Any

from engine.loop.agent import Finish, RunTools
from engine.loop.commands import CallTools, Command, Put, ReleaseTools
from engine.loop.inflight import InFlight, next_turn_request, request_id
from engine.types import GenResult, Trajectory


class AgentTrajectories:
    """The multi-turn half of `RolloutLoop` (see the module docstring)."""

    def turn_start(self, request_id: str, validation: bool = False) -> int:
        """Multi-turn: where the current model turn of this request's trajectory (`validation`: of this
        validation prompt's conversation) starts in its response (the shell parses tool calls from the text
        after it)."""
        uid, idx = request_id.rsplit("#", 1)
        if validation:
            c = self.val_convs.get(request_id)
        else:
            st = self.in_flight.get(uid)
            c = st.convs.get(int(idx)) if st is not None else None
        if c is None:
            return 0
        return c.turns[-1].start if c.turn_open else len(c.response_ids)

    def tools_done(self, uid: str, index: int, answer_ids: list[int], validation: bool = False) -> list[Command]:
        """Multi-turn: the tools of trajectory `index` of `uid` answered (`answer_ids`: their user turn as
        token ids). The conversation goes on with its next model turn, under the weights current then.
        `validation`: the answers of the conversation of validation answer `index` of prompt `uid`."""
        if validation:
            return self._val_tools_done(request_id(uid, index), answer_ids)
        st = self.in_flight.get(uid)
        if st is None or index not in st.tools or self.stopped:
            return []
        st.tools.discard(index)
        c = st.convs[index]
        cmd = c.on_tool_answers(answer_ids)
        if isinstance(cmd, Finish):
            return self._agent_done(st, index, cmd)
        st.pending[index] = next_turn_request(st.prompt, index, c)
        return []

    def _agent_turn(self, st: InFlight, i: int, r: GenResult, calls: list[Any] | None) -> list[Command]:
        """A model turn of a multi-turn trajectory came back (stopped, cut by the budget, or interrupted)."""
        c = st.convs[i]
        new = len(c.response_ids)
        cmd = c.on_generated(list(r.response_ids[new:]), list(r.log_probs[new:]), r.finish_reason, r.min_version,
                             r.max_version, calls)
        if isinstance(cmd, Finish):
            st.done[i] = self._agent_trajectory(st, i, cmd)
            return self._release_tools([(st.prompt.uid, i, False)])
        if isinstance(cmd, RunTools):
            st.tools.add(i)
            self.tool_users.add((st.prompt.uid, i, False))
            return [CallTools(st.prompt.uid, i, tuple(cmd.calls), tuple(cmd.errors),
                              dict(st.prompt.extra_info.get("tools_kwargs") or {}))]
        st.pending[i] = next_turn_request(st.prompt, i, c, min_version=c.turns[-1].min_version)  # resumes
        return []

    def _agent_trajectory(self, st: InFlight, i: int, end: Finish) -> Trajectory:
        c = st.convs.pop(i)
        return Trajectory(list(c.response_ids), list(c.rollout_log_probs), "length" if end.reason == "length"
                          else "stop", c.min_version, c.max_version, loss_mask=list(c.loss_mask),
                          turns=len(c.turns), tool_calls=sum(t.tool_calls for t in c.turns))

    def _agent_done(self, st: InFlight, i: int, end: Finish) -> list[Command]:
        st.done[i] = self._agent_trajectory(st, i, end)
        released = self._release_tools([(st.prompt.uid, i, False)])
        if len(st.done) < self.p.n or self.p.deterministic:
            return released
        del self.in_flight[st.prompt.uid]
        return released + [Put(st.prompt, tuple(st.done[k] for k in range(self.p.n)), st.admitted_version, st.admitted_at)]

    def _release_tools(self, keys: list[tuple[str, int, bool]]) -> list[Command]:
        """`ReleaseTools` for those of these ended trajectories that called tools (their instances end)."""
        ended = tuple(k for k in keys if k in self.tool_users)
        self.tool_users.difference_update(ended)
        return [ReleaseTools(ended)] if ended else []
