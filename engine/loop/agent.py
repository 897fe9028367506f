"""One trajectory's conversation with its tools, as a pure core (events in, commands out).

A multi-turn trajectory is the prompt followed by one token stream, `response_ids`, that alternates the
model's turns (sampled tokens) with the tools' answers (tokens rendered by the chat template). Token in, token
out: each turn is generated from `prompt_ids + response_ids` exactly as sampled so far, and a tool's answer is
appended as token ids — the conversation is never re-tokenised, so the trained tokens are the sampled ones.

For every response token the core records
- `loss_mask` — 1 for a model token, 0 for a tool/template token (excluded from the loss, the advantages'
  token aggregation and the log-prob diagnostics);
- `rollout_log_probs` — log π_rollout of a model token, 0.0 for a masked one;
and per turn the (min, max) policy version of its model tokens; the trajectory's version span is over model
tokens only (a tool answer has no version).

The decisions (verl's `multi_turn` names):
- a generation interrupted by a weight sync (`abort`) resumes the same turn from its token boundary;
- a turn that ends (`stop`) with no tool call ends the trajectory; with calls it runs at most
  `max_parallel_calls` of them (the rest get an error text), unless `max_assistant_turns` or
  `max_user_turns` (a round of tool answers is one user turn) is reached;
- the response budget `max_response_length` covers model and tool tokens together: a generation gets only the
  remaining budget, and a tool answer that does not fit is cut to the budget and ends the trajectory;
- `max_tokens_per_turn` (asyncrl's key) ends a model turn after that many tokens as EOS would: its calls
  run, or, with none, the trajectory ends — a turn cut by the cap is parsed like a stopped one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from engine.agent.tool_calls import ParsedCall, ToolCall, ToolCallError

EndReason = Literal["stop", "length", "max_assistant_turns", "max_user_turns"]


@dataclass(frozen=True)
class AgentLimits:
    """verl's `actor_rollout_ref.rollout.multi_turn.*` limits and the response budget."""

    max_response_length: int
    max_assistant_turns: int | None = None
    max_user_turns: int | None = None
    max_parallel_calls: int = 1
    max_tokens_per_turn: int | None = None
    """A model turn ends after this many tokens even without EOS (None = only EOS or the budget ends it)."""


@dataclass(frozen=True)
class Generate:
    """Generate the next model tokens from `prompt_ids + prefix_ids`, at most `max_new_tokens`."""

    prefix_ids: list[int]
    max_new_tokens: int


@dataclass(frozen=True)
class RunTools:
    """Run `calls` (concurrently); `errors` are the model's malformed or surplus calls, answered as text."""

    calls: list[ToolCall]
    errors: list[str]


@dataclass(frozen=True)
class Finish:
    reason: EndReason


AgentCommand = Generate | RunTools | Finish


@dataclass
class TurnRecord:
    """One model turn: where its tokens are in the response, and the versions that produced them."""

    start: int
    end: int
    min_version: int
    max_version: int
    tool_calls: int = 0


@dataclass
class AgentConversation:
    """The state of one trajectory's conversation; the shell feeds it events and executes its commands."""

    limits: AgentLimits
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    rollout_log_probs: list[float] = field(default_factory=list)
    turns: list[TurnRecord] = field(default_factory=list)
    user_turns: int = 0
    ended: EndReason | None = None
    _open_turn: TurnRecord | None = None

    @property
    def turn_open(self) -> bool:
        """A model turn was interrupted by a sync and is being resumed."""
        return self._open_turn is not None

    def start(self) -> AgentCommand:
        """The first command (also the command after a restore from a checkpoint)."""
        if self.ended is not None:
            return Finish(self.ended)
        return Generate(list(self.response_ids), self.turn_budget())

    @property
    def remaining(self) -> int:
        return self.limits.max_response_length - len(self.response_ids)

    def turn_budget(self) -> int:
        """Tokens the next generation may produce: the response budget, capped by what is left of the turn."""
        cap = self.limits.max_tokens_per_turn
        if cap is None:
            return self.remaining
        used = self.turns[-1].end - self.turns[-1].start if self._open_turn is not None else 0
        return max(0, min(self.remaining, cap - used))

    @property
    def min_version(self) -> int:
        return min(t.min_version for t in self.turns)

    @property
    def max_version(self) -> int:
        return max(t.max_version for t in self.turns)

    def on_generated(self, new_ids: list[int], new_log_probs: list[float], finish: str, min_version: int,
                     max_version: int, calls: list[ParsedCall] | None = None) -> AgentCommand:
        """Tokens of the current model turn arrived. `calls` are the turn's parsed tool calls (the shell
        parses the turn's text once it has `stop`ped; ignored otherwise)."""
        assert self.ended is None, "conversation already ended"
        if len(new_ids) != len(new_log_probs):
            raise ValueError("one log-prob per generated token")
        new_ids = new_ids[: self.remaining]
        turn = self._open_turn
        if turn is None:
            turn = TurnRecord(len(self.response_ids), len(self.response_ids), min_version, max_version)
            self.turns.append(turn)
        self.response_ids += new_ids
        self.loss_mask += [1] * len(new_ids)
        self.rollout_log_probs += new_log_probs[: len(new_ids)]
        turn.end = len(self.response_ids)
        turn.min_version = min(turn.min_version, min_version)
        turn.max_version = max(turn.max_version, max_version)
        if finish == "abort" and self.remaining > 0:  # interrupted by a sync: resume this turn
            self._open_turn = turn
            if self.turn_budget() > 0:
                return Generate(list(self.response_ids), self.turn_budget())
            finish = "length"  # the turn had reached max_tokens_per_turn: it ends here
        self._open_turn = None
        if self.remaining <= 0:
            return self._finish("length")
        if finish == "length" and self.limits.max_tokens_per_turn is None:
            return self._finish("length")
        calls = calls or []
        if not calls:
            return self._finish("stop")
        if self.limits.max_assistant_turns is not None and len(self.turns) >= self.limits.max_assistant_turns:
            return self._finish("max_assistant_turns")
        if self.limits.max_user_turns is not None and self.user_turns >= self.limits.max_user_turns:
            return self._finish("max_user_turns")
        good = [c for c in calls if isinstance(c, ToolCall)]
        errors = [c.message for c in calls if isinstance(c, ToolCallError)]
        run, surplus = good[: self.limits.max_parallel_calls], good[self.limits.max_parallel_calls:]
        errors += [f"call of {c.name!r} not run: at most {self.limits.max_parallel_calls} call(s) per turn"
                   for c in surplus]
        turn.tool_calls = len(run)
        return RunTools(run, errors)

    def on_tool_answers(self, answer_ids: list[int]) -> AgentCommand:
        """The tools' answers, rendered as one user turn of token ids by the chat template."""
        assert self.ended is None, "conversation already ended"
        fit = answer_ids[: self.remaining]
        self.response_ids += fit
        self.loss_mask += [0] * len(fit)
        self.rollout_log_probs += [0.0] * len(fit)
        self.user_turns += 1
        if len(fit) < len(answer_ids) or self.remaining <= 0:
            return self._finish("length")
        return Generate(list(self.response_ids), self.turn_budget())

    def _finish(self, reason: EndReason) -> Finish:
        self.ended = reason
        return Finish(reason)
