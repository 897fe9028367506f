"""The simulator's model turns and tools (multi-turn scenarios): what a model's turn ends with, and the tools
that answer it — an executor only, the conversation's decisions are `engine.loop.agent`'s.

Tokens tell the world where a turn starts: a model token is `MODEL_TOKEN` (log-prob `MODEL_LOG_PROB`), every
tool answer is a run of one fresh id `TOOL_BASE + k` (k counts answers over the world's life), so a turn starts
after the last token ≥ `TOOL_BASE` of its prefix. Whether a turn ends with tool calls (1-3, sometimes one
malformed) is a pure function of the seed, the request id and the turn's start, as its length is, so a resumed
turn ends as it would have. `CallTools` runs every call concurrently: each takes `tool_latency × U(0.5, 1.5)`,
20× that with probability `tool_tail`, and one still running at `tool_timeout` answers with a 2-token error
text at that moment; the answers come back as one `tools_done` after the slowest. `answers` records every
answer id the world appended (the checks compare the trained tokens with it). `tool_sessions` are the
trajectories whose tools' instances are open (a `CallTools` opens, a `ReleaseTools` ends them; the checks want
none open for a group put into the queue, nor at the end). Validation conversations call
tools the same way (`CallTools.validation`), so the validation checks cover their turns too.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

from engine.agent.tool_calls import ToolCall, ToolCallError
from engine.loop.commands import CallTools, ReleaseTools
from engine.types import GenRequest

MODEL_TOKEN = 7
MODEL_LOG_PROB = -0.5
TOOL_BASE = 1000


def turn_start(prefix_ids: Sequence[int]) -> int:
    """Where the current model turn starts in a response: after its last tool-answer token."""
    for k in range(len(prefix_ids) - 1, -1, -1):
        if prefix_ids[k] >= TOOL_BASE:
            return k + 1
    return 0


class SimTools:
    """The tool side of `World` (a mixin: uses `s`, `now`, `_at`, `_execute`, `rollout`, `run_epoch`, `check`)."""

    tool_waits: dict[tuple[str, int], float]
    tool_sessions: set[tuple[str, int, bool]]
    answers: dict[int, tuple[str, int, int]]
    train_answers = 0
    """Tool answers appended to training trajectories (a measure of progress: `World`'s stall budget)."""

    def _hash(self, *key: Any) -> int:
        return zlib.crc32(":".join(str(k) for k in (self.s.seed, *key)).encode())

    def _turn_calls(self, req: GenRequest) -> list[Any]:
        """The tool calls the turn of `req` ends with (empty: it ends the conversation)."""
        start = turn_start(req.prefix_ids)
        h = self._hash(req.request_id, start, "calls")
        if (h % 1000) / 1000 >= self.s.tool_call_p:
            return []
        calls: list[Any] = [ToolCall("calculator", {"expression": f"{i}+{start}"}) for i in range(1 + (h >> 10) % 3)]
        if (h >> 12) % 5 == 0:
            calls.append(ToolCallError("{calculator", "malformed tool call: expected JSON"))
        return calls

    def _release_tools(self, c: ReleaseTools) -> None:
        """The stateful tools' instances of these trajectories end (`tool_sessions`: the ones open)."""
        for key in c.trajectories:
            if key not in self.tool_sessions:
                self.check.violation("tools-release", f"{key} released without an open tool instance")
            self.tool_sessions.discard(key)

    def _call_tools(self, c: CallTools) -> None:
        self.tool_sessions.add((c.uid, c.index, c.validation))
        s, latest = self.s, 0.0
        size = 0
        for k in range(len(c.calls) + len(c.errors)):
            took = 0.0
            tokens = 2
            if k < len(c.calls):
                took = s.tool_latency * self.tool_rng.uniform(0.5, 1.5) * (20 if self.tool_rng.random() < s.tool_tail
                                                                           else 1)
                if s.tool_timeout is not None and took > s.tool_timeout:
                    took = s.tool_timeout  # answered with the timeout's error text
                else:
                    tokens = self.tool_rng.randint(1, 2 * s.tool_answer_tokens)
            latest = max(latest, took)
            size += tokens
        if not c.validation:  # a validation conversation's wait is covered by the validation checks
            self.tool_waits[(c.uid, c.index)] = self.now
        self._at(self.now + latest, "tools_answered", (self.run_epoch, c.uid, c.index, size, c.validation))

    def _on_tools_answered(self, run_epoch: int, uid: str, index: int, size: int, validation: bool) -> None:
        if run_epoch != self.run_epoch:
            return  # the trainer died meanwhile: the resumed conversation generates its turn again
        if not validation:
            self.train_answers += 1
            self.tool_waits.pop((uid, index), None)
            self.check.on_tools_answered(uid, index)
        token = TOOL_BASE + len(self.answers)
        self.answers[token] = (uid, index, size)
        self._execute(self.rollout.tools_done(uid, index, [token] * size, validation))
