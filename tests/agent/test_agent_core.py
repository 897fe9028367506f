"""The per-trajectory conversation core: the loss mask is exactly the sampled model tokens, a sync mid-turn
resumes the turn, the limits end the conversation as verl's multi_turn keys say."""

from __future__ import annotations

from engine.agent.tool_calls import ToolCall, ToolCallError
from engine.loop.agent import AgentConversation, AgentLimits, Finish, Generate, RunTools

CALC = ToolCall("calculator", {"expression": "2+2"})


def test_loss_mask_covers_exactly_the_sampled_model_tokens():
    conv = AgentConversation(AgentLimits(max_response_length=100))
    assert conv.start() == Generate([], 100)
    sampled: list[int] = []
    cmd = conv.on_generated([11, 12, 13], [-0.1, -0.2, -0.3], "stop", 4, 4, [CALC])
    sampled += [11, 12, 13]
    assert isinstance(cmd, RunTools) and cmd.calls == [CALC]
    cmd = conv.on_tool_answers([90, 91])
    assert cmd == Generate([11, 12, 13, 90, 91], 95)
    cmd = conv.on_generated([14, 15], [-0.4, -0.5], "stop", 5, 5, [])
    sampled += [14, 15]
    assert cmd == Finish("stop")
    trained = [t for t, m in zip(conv.response_ids, conv.loss_mask) if m]
    assert trained == sampled
    assert conv.rollout_log_probs == [-0.1, -0.2, -0.3, 0.0, 0.0, -0.4, -0.5]
    assert [(t.min_version, t.max_version) for t in conv.turns] == [(4, 4), (5, 5)]
    assert (conv.min_version, conv.max_version) == (4, 5)


def test_a_sync_mid_turn_resumes_the_same_turn_from_its_token_boundary():
    conv = AgentConversation(AgentLimits(max_response_length=10))
    cmd = conv.on_generated([1, 2], [-1.0, -1.0], "abort", 3, 3)
    assert cmd == Generate([1, 2], 8)
    cmd = conv.on_generated([3], [-1.0], "stop", 4, 4, [])
    assert cmd == Finish("stop")
    assert len(conv.turns) == 1 and (conv.turns[0].min_version, conv.turns[0].max_version) == (3, 4)


def test_limits_end_the_conversation():
    conv = AgentConversation(AgentLimits(max_response_length=100, max_assistant_turns=2))
    conv.on_generated([1], [0.0], "stop", 0, 0, [CALC])
    conv.on_tool_answers([9])
    assert conv.on_generated([2], [0.0], "stop", 0, 0, [CALC]) == Finish("max_assistant_turns")

    conv = AgentConversation(AgentLimits(max_response_length=100, max_user_turns=1))
    conv.on_generated([1], [0.0], "stop", 0, 0, [CALC])
    conv.on_tool_answers([9])
    assert conv.on_generated([2], [0.0], "stop", 0, 0, [CALC]) == Finish("max_user_turns")

    conv = AgentConversation(AgentLimits(max_response_length=5))
    conv.on_generated([1, 2], [0.0, 0.0], "stop", 0, 0, [CALC])
    assert conv.on_tool_answers([7, 8, 9, 10]) == Finish("length")
    assert conv.response_ids == [1, 2, 7, 8, 9] and conv.loss_mask == [1, 1, 0, 0, 0]


def test_malformed_and_surplus_calls_are_answered_as_errors():
    conv = AgentConversation(AgentLimits(max_response_length=100, max_parallel_calls=1))
    cmd = conv.on_generated([1], [0.0], "stop", 0, 0, [ToolCallError("{", "bad json"), CALC, CALC])
    assert isinstance(cmd, RunTools) and cmd.calls == [CALC]
    assert cmd.errors[0] == "bad json" and "at most 1 call" in cmd.errors[1]


def test_max_tokens_per_turn_ends_a_turn_like_eos():
    conv = AgentConversation(AgentLimits(max_response_length=20, max_tokens_per_turn=3))
    assert conv.start() == Generate([], 3)
    cmd = conv.on_generated([1, 2, 3], [0.0] * 3, "length", 0, 0, [CALC])
    assert isinstance(cmd, RunTools)  # the cap ended the turn: its call runs
    assert conv.on_tool_answers([9, 9]) == Generate([1, 2, 3, 9, 9], 3)
    assert conv.on_generated([4], [0.0], "abort", 1, 1) == Generate([1, 2, 3, 9, 9, 4], 2)  # the rest of the turn
    assert conv.on_generated([5, 6], [0.0] * 2, "length", 1, 1, []) == Finish("stop")
