"""`RolloutLoop` streaming several dispatches per replica: free rows are refilled as groups come back, a sync
aborts and resumes all of a replica's calls, a death re-queues all of them, validation still runs on an
aborted replica, and a replica of one call behaves as one batch per call."""

from __future__ import annotations

from engine.loop.commands import Abort, Dispatch, Put, Resume, ValidationDone
from engine.loop.dispatch import Capacity
from engine.loop.rollout import RolloutLoop, RolloutParams
from engine.loop.stream import PromptStream
from engine.types import GenResult, Prompt


def _loop(capacities: list[Capacity], *, val: int = 0, staleness: float = 3.0, partial: bool = True,
          required: int = 2) -> RolloutLoop:
    params = RolloutParams(n=2, max_new_tokens=8, required_samples=required, staleness_threshold=staleness,
                           trigger=1, partial_rollout=partial, seqs_per_call=8)
    stream = PromptStream(1, 40)
    stream.deliver(0, [Prompt(f"p{i}", i, 0, [1, 2]) for i in range(40)])
    vals = [Prompt(f"v{i}", i, 0, [3]) for i in range(val)]
    return RolloutLoop(params, stream, vals, len(capacities), capacities)


def _answer(d: Dispatch, reason: str = "stop", tokens: int = 3) -> list[GenResult]:
    return [GenResult(r.request_id, list(r.prefix_ids) + [9] * tokens, [0.0] * (len(r.prefix_ids) + tokens),
                      reason, 0, 0, tokens) for r in d.requests]


def _dispatches(cmds: list) -> list[Dispatch]:
    return [c for c in cmds if isinstance(c, Dispatch)]


def test_a_replica_gets_one_group_per_call_up_to_its_calls_and_rows() -> None:
    loop = _loop([Capacity(rows=8, calls=4)])  # one group (n = 2 rows) per call, the last takes what is left
    ds = _dispatches(loop.tick(0.0))
    assert len(ds) == 4 and all(len(d.requests) == 2 and d.replica == 0 for d in ds)
    assert len({d.dispatch_id for d in ds}) == 4
    assert _dispatches(loop.tick(0.0)) == []  # every call and row is taken


def test_a_finished_group_is_put_at_once_and_its_rows_refilled_while_the_others_run() -> None:
    loop = _loop([Capacity(rows=8, calls=4)])
    ds = _dispatches(loop.tick(0.0))
    cmds = loop.generation_finished(0, _answer(ds[2]), 0.1, ds[2].dispatch_id)
    assert [type(c) for c in cmds] == [Put] and cmds[0].prompt.uid == ds[2].requests[0].request_id.split("#")[0]
    loop.group_put(None)
    (refill,) = _dispatches(loop.tick(0.2))
    assert len(refill.requests) == 2 and refill.dispatch_id not in {d.dispatch_id for d in ds}
    assert len(loop.running[0]) == 4


def test_a_sync_aborts_every_call_of_a_replica_and_resumes_them_from_their_prefixes() -> None:
    loop = _loop([Capacity(rows=8, calls=4), Capacity(rows=8, calls=4)])
    ds = _dispatches(loop.tick(0.0))
    assert {d.replica for d in ds} == {0, 1}
    assert loop.begin_sync(1, 1) == [Abort((0, 1))]
    for d in ds[:-1]:
        loop.generation_finished(d.replica, _answer(d, "abort", 1), 0.1, d.dispatch_id)
        assert not loop.sync_ready()  # a call of a replica is still out
    loop.generation_finished(ds[-1].replica, _answer(ds[-1], "abort", 1), 0.1, ds[-1].dispatch_id)
    assert loop.sync_ready()
    assert Resume((0, 1)) in loop.finish_sync(1, 1)
    resumed = [r for d in _dispatches(loop.tick(0.2)) for r in d.requests]
    assert sorted(r.request_id for r in resumed) == sorted(r.request_id for d in ds for r in d.requests)
    assert all(r.prefix_ids == [9] and r.max_new_tokens == 7 for r in resumed)


def test_a_dead_replica_puts_back_every_one_of_its_calls() -> None:
    loop = _loop([Capacity(rows=6, calls=3), Capacity(rows=2, calls=1)])
    ds = _dispatches(loop.tick(0.0))
    on0 = [r.request_id for d in ds if d.replica == 0 for r in d.requests]
    assert len(on0) == 6
    loop.replica_died(0)
    assert 0 not in loop.running
    pending = [st.pending[i].request_id for st in loop.in_flight.values() for i in st.pending]
    assert sorted(pending) == sorted(on0)
    loop.replica_up(0)
    again = [r.request_id for d in _dispatches(loop.tick(1.0)) for r in d.requests]
    assert sorted(again) == sorted(on0)  # resumed work goes first: no new prompt was admitted before it


def test_a_late_answer_of_a_dead_replica_is_ignored() -> None:
    loop = _loop([Capacity(rows=4, calls=2)])
    ds = _dispatches(loop.tick(0.0))
    loop.replica_died(0)
    assert loop.generation_finished(0, _answer(ds[0]), 0.1, ds[0].dispatch_id) == []
    assert not loop.dropped and all(not st.done for st in loop.in_flight.values())


def test_validation_runs_on_a_replica_whose_training_calls_are_aborted() -> None:
    loop = _loop([Capacity(rows=4, calls=2)], val=2)
    train = _dispatches(loop.tick(0.0))
    assert all(d.kind == "train" for d in train)
    loop.begin_sync(1, 1)
    loop.generation_finished(0, _answer(train[0], "abort", 1), 0.1, train[0].dispatch_id)
    loop.queue_validation(0)
    (val,) = _dispatches(loop.tick(0.2))  # the replica is aborted for training, but validation runs
    assert val.kind == "val" and len(val.requests) == 2
    loop.generation_finished(0, _answer(train[1], "abort", 1), 0.3, train[1].dispatch_id)
    assert not loop.sync_ready()
    (done,) = loop.generation_finished(0, _answer(val), 0.4, val.dispatch_id)
    assert isinstance(done, ValidationDone) and loop.sync_ready()


def test_stop_aborts_validation_calls_too() -> None:
    loop = _loop([Capacity(rows=4, calls=2)])
    loop.tick(0.0)
    assert loop.stop() == [Abort((0,), validation=True)]


def test_a_replica_of_one_call_gets_one_batch_of_all_its_rows_as_before() -> None:
    loop = _loop([Capacity(rows=8, calls=1)])
    (d,) = _dispatches(loop.tick(0.0))
    assert len(d.requests) == 8
    assert _dispatches(loop.tick(0.0)) == []
    loop.generation_finished(0, _answer(d), 0.1)  # without the id: the one dispatch of these requests
    assert not loop.running


def test_rows_too_few_for_a_group_take_only_put_back_requests() -> None:
    loop = _loop([Capacity(rows=5, calls=3), Capacity(rows=2, calls=1)], required=4)
    ds = _dispatches(loop.tick(0.0))  # replica 0: two groups, 1 row left for its last call (< n): no group
    assert [(d.replica, len(d.requests)) for d in ds] == [(0, 2), (1, 2), (0, 2)]  # round robin
    loop.replica_died(1)  # its group's two requests are pending again
    (d,) = _dispatches(loop.tick(0.1))
    assert (d.replica, len(d.requests)) == (0, 1) and loop.dispatches.rows_on(0) == 5
    assert sum(len(st.pending) for st in loop.in_flight.values()) == 1


def test_replicas_share_a_small_budget_round_robin() -> None:
    loop = _loop([Capacity(rows=8, calls=4), Capacity(rows=8, calls=4)], staleness=1.0)  # budget: 4 prompts
    ds = _dispatches(loop.tick(0.0))
    assert len(ds) == 4 and [d.replica for d in ds].count(0) == [d.replica for d in ds].count(1) == 2
