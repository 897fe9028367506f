"""`ReplicaCalls.ready`, through real Ray actors behind the Ray replica peers (`engine.runtime.peers_ray`): the
rollouter's dispatch loop wakes as soon as *any* call returns (not when all of them have, or the timeout has run
out), and takes every call already done."""

from __future__ import annotations

import time

import pytest

from engine.rollout.base import SamplingParams
from engine.runtime.replica_calls import ReplicaCalls

pytestmark = pytest.mark.integration


def _sleeper(ray):
    @ray.remote(num_cpus=0)
    class Sleeper:
        def generate(self, requests, sampling, kind):
            time.sleep(requests[0])
            return []

    return Sleeper


def test_ready_returns_at_the_first_finished_call_and_takes_all_done(ray_local) -> None:
    ray = ray_local
    Sleeper = _sleeper(ray)
    from engine.runtime.peers_ray import RayReplica, ray_wait

    actors = Sleeper.remote(), Sleeper.remote()
    quick, slow = (RayReplica(a) for a in actors)
    calls = ReplicaCalls(ray_wait)
    sampling = SamplingParams()
    calls.send(quick, 0, 1, [0.2], sampling, "train", time.monotonic())
    calls.send(slow, 1, 2, [20.0], sampling, "train", time.monotonic())
    start = time.monotonic()
    ready = calls.ready(timeout=30.0)
    assert time.monotonic() - start < 10.0  # woken by the quick call, long before the slow one or the timeout
    assert [calls.done(ref, time.monotonic()) for ref in ready] == [(0, 1)]
    assert calls.ready(timeout=0.0) == []  # the slow call is still out
    calls.send(quick, 0, 3, [0.0], sampling, "train", time.monotonic())
    calls.send(quick, 0, 4, [0.0], sampling, "train", time.monotonic())
    time.sleep(2.0)  # both quick calls are done before we look: one turn takes both
    assert sorted(calls.done(ref, time.monotonic()) for ref in calls.ready(timeout=5.0)) == [(0, 3), (0, 4)]
    ray.kill(actors[1])
