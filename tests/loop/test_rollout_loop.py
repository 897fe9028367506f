"""`RolloutLoop` event by event: the sync protocol, validation across a sync, the queue bound, drops."""

from __future__ import annotations

import dataclasses

from engine.loop.commands import Abort, Dispatch, NeedPrompts, Put, Resume, SetQueueBound, ValidationDone
from engine.loop.knobs import KnobChange
from engine.loop.rollout import RolloutLoop, RolloutParams
from engine.loop.stream import PromptStream
from engine.types import GenResult, Prompt


def _loop(partial: bool = True, val: int = 0, replicas: int = 2, test_freq: int = 0) -> RolloutLoop:
    params = RolloutParams(n=2, max_new_tokens=8, required_samples=2, staleness_threshold=0.5, trigger=1,
                           partial_rollout=partial, seqs_per_call=2, test_freq=test_freq)
    stream = PromptStream(1, 20)
    stream.deliver(0, [Prompt(f"p{i}", i, 0, [1, 2]) for i in range(20)])
    vals = [Prompt(f"v{i}", i, 0, [3]) for i in range(val)]
    return RolloutLoop(params, stream, vals, replicas)


def _answer(d: Dispatch, reason: str = "stop", tokens: int = 3, version: int = 0) -> list[GenResult]:
    return [GenResult(r.request_id, list(r.prefix_ids) + [9] * tokens, [0.0] * (len(r.prefix_ids) + tokens),
                      reason, version, version, tokens) for r in d.requests]


def test_a_raised_interval_raises_the_budget_and_the_queue_bound_at_once() -> None:
    loop = _loop()
    assert loop.budget.limit == 3
    # the trainer applied it: the rollouter follows the applied value through its inbox (not owned, no ack)
    cmds = loop.knob(KnobChange("trigger_parameter_sync_step", 4, 1, owned=False))
    assert loop.budget.limit == 12 and cmds == [SetQueueBound(12)]


def test_in_sync_mode_a_followed_interval_waits_for_the_sync_the_trainer_takes_it_at() -> None:
    loop = _loop()
    loop.p = dataclasses.replace(loop.p, sync_mode=True)
    assert loop.knob(KnobChange("trigger_parameter_sync_step", 4, 1, owned=False)) == []
    assert loop.budget.trigger == 1  # this version's cycle is generated for the interval it started with
    loop.begin_sync(1, 1)
    loop.finish_sync(1, 1)
    assert loop.budget.trigger == 4 and loop.queue_bound == loop.budget.limit


def test_a_sync_aborts_training_work_but_never_validation() -> None:
    loop = _loop(val=2)
    loop.queue_validation(0)
    d_val, d_train = loop.tick(0.0)
    assert d_val.kind == "val" and d_train.kind == "train"
    cmds = loop.begin_sync(1, 1)
    assert cmds == [Abort((d_train.replica,))]
    assert not loop.sync_ready()
    loop.generation_finished(d_train.replica, _answer(d_train, "abort", 1), 0.1)
    assert not loop.sync_ready()  # the validation of version 0 is still running
    done = loop.generation_finished(d_val.replica, _answer(d_val), 0.2)
    assert isinstance(done[0], ValidationDone) and done[0].version == 0
    assert all(r.finish_reason == "stop" for r in done[0].results)
    assert loop.sync_ready()
    cmds = loop.finish_sync(1, 1)
    assert Resume((d_train.replica,)) in cmds
    resumed = [c for c in loop.tick(0.3) if isinstance(c, Dispatch)]
    assert any(r.prefix_ids == [9] for c in resumed for r in c.requests)  # the aborted prefix continues


def test_an_aborted_validation_answer_is_asked_again_not_scored() -> None:
    loop = _loop(val=2, replicas=1)
    loop.queue_validation(0)
    (d,) = loop.tick(0.0)
    assert loop.generation_finished(d.replica, _answer(d, "abort", 1), 0.1) == []
    assert len(loop.val_pending) == 2


def test_without_partial_rollout_aborted_prompts_are_dropped_and_released() -> None:
    loop = _loop(partial=False, replicas=1)
    (d,) = loop.tick(0.0)
    admitted = loop.budget.staleness_samples
    loop.begin_sync(1, 1)
    loop.generation_finished(d.replica, _answer(d, "abort", 1), 0.1)
    assert [why for _, why in loop.dropped] == ["aborted_at_sync"]
    assert loop.budget.staleness_samples == admitted - 1 and not loop.in_flight


def test_finished_groups_are_put_and_count_in_the_queue() -> None:
    loop = _loop(replicas=1)
    (d,) = loop.tick(0.0)
    (put,) = loop.generation_finished(d.replica, _answer(d), 0.1)
    assert isinstance(put, Put) and len(put.trajectories) == 2
    loop.group_put(None)
    assert loop.queue_size == 1 and loop.total_generated == 1


def test_the_core_asks_for_each_epochs_prompts_and_admits_them_once_delivered() -> None:
    params = RolloutParams(n=2, max_new_tokens=8, required_samples=2, staleness_threshold=0.0, trigger=1,
                           partial_rollout=True, seqs_per_call=2)
    loop = RolloutLoop(params, PromptStream(total_epochs=2, total=3), [], 1)
    assert loop.tick(0.0) == [NeedPrompts(0)]  # no I/O in the core: the shell reads and renders the epoch
    assert loop.tick(0.0) == []  # asked once
    loop.prompts_loaded(0, [Prompt(f"0:{i}", i, 0, [1]) for i in range(2)])
    first = [c for c in loop.tick(0.0) if isinstance(c, Dispatch)]
    assert [r.request_id for r in first[0].requests] == ["0:0#0", "0:0#1"]
    state = loop.snapshot_state()["rollout"]["stream"]
    again = RolloutLoop(params, PromptStream(total_epochs=2, total=3), [], 1)
    again.stream.restore(state)
    assert again.tick(0.0) == [NeedPrompts(0)]  # a restored stream asks for its epoch again (same order)
