"""Multi-turn trajectories through `RolloutLoop`: a turn with tool calls waits for its tools off the
replicas (a sync does not abort it), the next turn is generated under the weights current then, the loss mask
is exactly the sampled model tokens, and a checkpoint taken while tools run resumes with an exact ledger."""

from __future__ import annotations

from engine.agent.tool_calls import ToolCall
from engine.loop.agent import AgentLimits
from engine.loop.commands import Abort, CallTools, Dispatch, Put, ReleaseTools, ValidationDone
from engine.loop.rollout import RolloutLoop, RolloutParams
from engine.loop.stream import PromptStream
from engine.trainer.batch import collate
from engine.types import GenResult, Prompt, TrajectoryGroup

CALC = ToolCall("calculator", {"expression": "2+2"})


def _loop(prompts: int = 1) -> RolloutLoop:
    params = RolloutParams(n=2, max_new_tokens=32, required_samples=1, staleness_threshold=1.0, trigger=1,
                           partial_rollout=True, seqs_per_call=2, agent=AgentLimits(32, max_assistant_turns=4))
    stream = PromptStream(1, prompts)
    stream.deliver(0, [Prompt(f"p{i}", i, 0, [1, 2]) for i in range(prompts)])
    return RolloutLoop(params, stream, [], 1)


def _turn(req, tokens: list[int], version: int, reason: str = "stop") -> GenResult:
    return GenResult(req.request_id, list(req.prefix_ids) + tokens,
                     list(req.prefix_log_probs) + [-0.5] * len(tokens), reason, version, version, len(tokens))


def test_a_tool_turn_waits_off_replica_through_a_sync_and_trains_only_model_tokens():
    loop = _loop()
    (d,) = loop.tick(0.0)
    r0, r1 = d.requests
    assert loop.turn_start(r0.request_id) == 0
    cmds = loop.generation_finished(0, [_turn(r0, [5, 6, 7], 0), _turn(r1, [8], 0)], 0.1,
                                    tool_calls={r0.request_id: [CALC], r1.request_id: []})
    assert cmds == [CallTools("p0", 0, (CALC,), ())]
    assert loop.begin_sync(1, 1) == []  # nothing runs on a replica: the tool wait is not aborted
    assert loop.sync_ready()
    loop.finish_sync(1, 1)
    assert loop.tools_done("p0", 0, [70, 71]) == []
    (d2,) = [c for c in loop.tick(0.2) if isinstance(c, Dispatch)]
    (req,) = d2.requests
    assert req.prefix_ids == [5, 6, 7, 70, 71] and req.max_new_tokens == 32 - 5
    assert loop.turn_start(req.request_id) == 5
    release, put = loop.generation_finished(0, [_turn(req, [9, 1], 1)], 0.3, tool_calls={req.request_id: []})
    assert release == ReleaseTools((("p0", 0, False),))  # only the trajectory that called tools, before its Put
    assert isinstance(put, Put)
    t0 = put.trajectories[0]
    assert t0.response_ids == [5, 6, 7, 70, 71, 9, 1] and t0.loss_mask == [1, 1, 1, 0, 0, 1, 1]
    assert t0.rollout_log_probs == [-0.5, -0.5, -0.5, 0.0, 0.0, -0.5, -0.5]
    assert (t0.min_version, t0.max_version, t0.turns, t0.tool_calls) == (0, 1, 2, 1)
    # the trainer sees exactly the sampled model tokens
    batch = collate([TrajectoryGroup(put.prompt, list(put.trajectories))], pad_token_id=0)
    p_len = batch.input_ids.shape[1] - batch.response_mask.shape[1]
    trained = batch.input_ids[0, p_len:][batch.response_mask[0] > 0].tolist()
    assert trained == [5, 6, 7, 9, 1]


def test_a_turn_interrupted_by_a_sync_resumes_within_the_same_turn():
    loop = _loop()
    (d,) = loop.tick(0.0)
    r0, r1 = d.requests
    assert loop.begin_sync(1, 1) == [Abort((0,))]
    loop.generation_finished(0, [_turn(r0, [5], 0, "abort"), _turn(r1, [8], 0, "abort")], 0.1)
    loop.finish_sync(1, 1)
    (d2,) = [c for c in loop.tick(0.2) if isinstance(c, Dispatch)]
    req = d2.requests[0]
    assert req.prefix_ids == [5] and req.min_version == 0
    assert loop.turn_start(req.request_id) == 0  # the open turn started at 0: calls are parsed from there
    cmds = loop.generation_finished(0, [_turn(req, [6], 1)], 0.3, tool_calls={req.request_id: [CALC]})
    assert cmds == [CallTools("p0", 0, (CALC,), ())]
    conv = loop.in_flight["p0"].convs[0]
    assert len(conv.turns) == 1 and (conv.turns[0].min_version, conv.turns[0].max_version) == (0, 1)


def test_a_checkpoint_while_tools_run_regenerates_that_turn_and_keeps_the_ledger():
    loop = _loop()
    (d,) = loop.tick(0.0)
    r0, r1 = d.requests
    loop.generation_finished(0, [_turn(r0, [5, 6], 0), _turn(r1, [8], 0)], 0.1,
                             tool_calls={r0.request_id: [CALC], r1.request_id: [CALC]})
    loop.tools_done("p0", 1, [70])  # index 1 got its answer and is pending its second turn
    snap = loop.snapshot_state()
    fresh = _loop()
    fresh.restore_state(snap["rollout"], snap["in_flight"], 1.0)
    st = fresh.in_flight["p0"]
    assert set(st.pending) == {0, 1} and not st.done
    assert st.pending[0].prefix_ids == []  # its turn with the unanswered call is generated again
    assert st.pending[1].prefix_ids == [8, 70] and st.convs[1].loss_mask == [1, 0]
    assert fresh.tools_done("p0", 0, [70]) == []  # an answer owed to the old process is ignored


def _val_loop() -> RolloutLoop:
    params = RolloutParams(n=2, max_new_tokens=32, required_samples=1, staleness_threshold=1.0, trigger=1,
                           partial_rollout=True, seqs_per_call=2, test_freq=1,
                           agent=AgentLimits(32, max_assistant_turns=4))
    stream = PromptStream(1, 1)
    stream.deliver(0, [Prompt("0:0", 0, 0, [1, 2])])
    # the validation prompt shares its uid with a training prompt (both are `epoch:index`)
    return RolloutLoop(params, stream, [Prompt("0:0", 0, 0, [3, 4], extra_info={"tools_kwargs": {"t": {}}})], 1)


def test_validation_runs_the_agent_loop_and_a_sync_waits_for_its_tools():
    loop = _val_loop()
    loop.queue_validation(0)
    (d,) = [c for c in loop.tick(0.0) if isinstance(c, Dispatch) and c.kind == "val"]
    (req,) = d.requests
    assert req.request_id == "0:0#0" and req.prompt_ids == [3, 4] and req.max_new_tokens == 32
    cmds = loop.generation_finished(0, [_turn(req, [5, 6], 0)], 0.1, d.dispatch_id,
                                    tool_calls={req.request_id: [CALC]})
    assert cmds == [CallTools("0:0", 0, (CALC,), (), {"t": {}}, validation=True)]
    assert loop.turn_start("0:0#0", validation=True) == 2
    assert loop.validating()  # waiting for its tools, the validation still runs
    loop.begin_sync(1, 1)
    assert not loop.sync_ready()  # a sync waits for the validation's tools and its next turn
    assert loop.tools_done("0:0", 0, [70, 71]) == []  # a training trajectory's answer: not this one's
    assert loop.tools_done("0:0", 0, [70, 71], validation=True) == []
    (d2,) = [c for c in loop.tick(0.2) if isinstance(c, Dispatch)]
    assert d2.kind == "val"
    (req2,) = d2.requests
    assert req2.prefix_ids == [5, 6, 70, 71] and req2.max_new_tokens == 32 - 4
    release, done = loop.generation_finished(0, [_turn(req2, [9, 1], 0)], 0.3, d2.dispatch_id,
                                             tool_calls={req2.request_id: []})
    assert release == ReleaseTools((("0:0", 0, True),))
    assert isinstance(done, ValidationDone) and done.version == 0
    (r,) = done.results
    assert r.response_ids == [5, 6, 70, 71, 9, 1] and r.finish_reason == "stop"  # the whole conversation
    assert (r.min_version, r.max_version) == (0, 0)
    assert (done.turns, done.tool_calls) == ((2,), (1,))
    assert loop.sync_ready() and loop.validated_version == 0


def test_single_turn_validation_is_unchanged():
    params = RolloutParams(n=1, max_new_tokens=8, required_samples=1, staleness_threshold=1.0, trigger=1,
                           partial_rollout=True, seqs_per_call=2)
    loop = RolloutLoop(params, PromptStream(1, 0), [Prompt("v", 0, 0, [3])], 1)
    loop.queue_validation(0)
    (d,) = [c for c in loop.tick(0.0) if isinstance(c, Dispatch)]
    (done,) = loop.generation_finished(0, [_turn(d.requests[0], [9], 0)], 0.1, d.dispatch_id,
                                       tool_calls={"v#0": [CALC]})
    assert done.results[0].response_ids == [9] and (done.turns, done.tool_calls) == ((), ())


def test_trajectories_that_called_tools_release_them_when_dropped_or_stopped():
    """`ReleaseTools` ends a trajectory's stateful tools wherever it ends: dropped at a sync (partial rollout
    off), or still waiting for its tools when the rollouter stops — once each, never for one without calls."""
    params = RolloutParams(n=2, max_new_tokens=32, required_samples=1, staleness_threshold=1.0, trigger=1,
                           partial_rollout=False, seqs_per_call=2, agent=AgentLimits(32, max_assistant_turns=4))
    stream = PromptStream(1, 2)
    stream.deliver(0, [Prompt(f"p{i}", i, 0, [1, 2]) for i in range(2)])
    loop = RolloutLoop(params, stream, [], 1, None)
    (d,) = loop.tick(0.0)
    r0, r1 = d.requests
    loop.generation_finished(0, [_turn(r0, [5], 0), _turn(r1, [8], 0, "abort")], 0.1, d.dispatch_id,
                             tool_calls={r0.request_id: [CALC]})
    loop.tools_done("p0", 0, [70])
    (d2,) = [c for c in loop.tick(0.2) if isinstance(c, Dispatch)]
    loop.begin_sync(1, 1)
    cmds = loop.generation_finished(0, [_turn(d2.requests[0], [6], 0, "abort")], 0.3, d2.dispatch_id)
    assert [c for c in cmds if isinstance(c, ReleaseTools)] == [ReleaseTools((("p0", 0, False),))]
    assert loop.stop() == [Abort((0,), validation=True)]  # nothing else holds tools
    loop2 = _loop(prompts=1)
    (d,) = loop2.tick(0.0)
    loop2.generation_finished(0, [_turn(q, [5], 0) for q in d.requests], 0.1,
                              tool_calls={q.request_id: [CALC] for q in d.requests})
    assert loop2.stop()[-1] == ReleaseTools((("p0", 0, False), ("p0", 1, False)))
