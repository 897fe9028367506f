"""Validation at `val_n` answers per prompt through `RolloutLoop`: n requests per prompt (`uid#0…n−1`), done only
when every answer is in, each multi-turn answer its own conversation with its own tools."""

from __future__ import annotations

from engine.agent.tool_calls import ToolCall
from engine.loop.agent import AgentLimits
from engine.loop.commands import CallTools, Dispatch, ReleaseTools, ValidationDone
from engine.loop.rollout import RolloutLoop, RolloutParams
from engine.loop.stream import PromptStream
from engine.types import GenResult, Prompt

CALC = ToolCall("calculator", {"expression": "2+2"})


def _params(agent: AgentLimits | None = None) -> RolloutParams:
    return RolloutParams(n=2, max_new_tokens=8, required_samples=1, staleness_threshold=1.0, trigger=1,
                         partial_rollout=True, seqs_per_call=8, agent=agent, val_n=3)


def _turn(req, tokens: list[int], version: int = 0) -> GenResult:
    return GenResult(req.request_id, list(req.prefix_ids) + tokens, list(req.prefix_log_probs) + [-0.5] * len(tokens),
                     "stop", version, version, len(tokens))


def test_each_validation_prompt_gets_val_n_requests_and_is_done_with_all_of_them() -> None:
    loop = RolloutLoop(_params(), PromptStream(1, 0), [Prompt("a", 0, 0, [3]), Prompt("b", 1, 0, [4])], 1)
    loop.queue_validation(0)
    (d,) = [c for c in loop.tick(0.0) if isinstance(c, Dispatch)]
    assert [r.request_id for r in d.requests] == ["a#0", "a#1", "a#2", "b#0", "b#1", "b#2"]
    assert [r.prompt_ids for r in d.requests] == [[3]] * 3 + [[4]] * 3
    out = loop.generation_finished(0, [_turn(r, [i]) for i, r in enumerate(d.requests[:5])], 0.1, None)
    assert not any(isinstance(c, ValidationDone) for c in out)  # one answer still missing: the dispatch is whole
    loop2 = RolloutLoop(_params(), PromptStream(1, 0), [Prompt("a", 0, 0, [3]), Prompt("b", 1, 0, [4])], 1)
    loop2.queue_validation(0)
    (d2,) = [c for c in loop2.tick(0.0) if isinstance(c, Dispatch)]
    (done,) = loop2.generation_finished(0, [_turn(r, [i]) for i, r in enumerate(d2.requests)][::-1], 0.1,
                                        d2.dispatch_id)
    assert isinstance(done, ValidationDone)
    assert [r.request_id for r in done.results] == ["a#0", "a#1", "a#2", "b#0", "b#1", "b#2"]  # prompt by prompt
    assert [r.response_ids for r in done.results] == [[0], [1], [2], [3], [4], [5]]


def test_multi_turn_validation_at_n_runs_one_conversation_per_answer() -> None:
    prompt = Prompt("v", 0, 0, [3], extra_info={"tools_kwargs": {"t": {}}})
    loop = RolloutLoop(_params(AgentLimits(8, max_assistant_turns=3)), PromptStream(1, 0), [prompt], 1)
    loop.queue_validation(0)
    (d,) = [c for c in loop.tick(0.0) if isinstance(c, Dispatch)]
    assert [r.request_id for r in d.requests] == ["v#0", "v#1", "v#2"]
    # answer 1 calls a tool, answers 0 and 2 answer at once
    cmds = loop.generation_finished(0, [_turn(d.requests[0], [7]), _turn(d.requests[1], [5, 6]),
                                        _turn(d.requests[2], [8])], 0.1, d.dispatch_id,
                                    tool_calls={"v#0": [], "v#1": [CALC], "v#2": []})
    assert cmds == [CallTools("v", 1, (CALC,), (), {"t": {}}, validation=True)]
    assert loop.turn_start("v#1", validation=True) == 2 and loop.validating()
    assert loop.tools_done("v", 0, [70], validation=True) == []  # answer 0 waits for no tool: ignored
    assert loop.tools_done("v", 1, [70, 71], validation=True) == []
    (d2,) = [c for c in loop.tick(0.2) if isinstance(c, Dispatch)]
    (req,) = d2.requests
    assert req.request_id == "v#1" and req.prefix_ids == [5, 6, 70, 71]
    release, done = loop.generation_finished(0, [_turn(req, [9])], 0.3, d2.dispatch_id, tool_calls={"v#1": []})
    assert release == ReleaseTools((("v", 1, True),))  # only answer 1 called a tool
    assert isinstance(done, ValidationDone)
    assert [r.response_ids for r in done.results] == [[7], [5, 6, 70, 71, 9], [8]]
    assert (done.turns, done.tool_calls) == ((1, 2, 1), (0, 1, 0))
