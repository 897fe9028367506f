"""The replica contract the streaming rollouter relies on, through a real Ray actor: concurrent `generate`
calls share the running batch, `capacity()` reports the free rows, and `abort()` ends every call at a token
boundary (until `resume`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncrl_cli.config.loader import load_run_config
from engine.rollout.base import SamplingParams
from engine.types import GenRequest

pytestmark = pytest.mark.integration
TINY = Path(__file__).resolve().parents[2] / "presets" / "runs" / "tiny-cpu.toml"


@pytest.fixture(scope="module")
def replica(ray_local):
    ray = ray_local

    from engine.models.loader import resolve_model_path
    from engine.runtime.actors import RolloutReplica

    from dataclasses import replace

    from engine.plan.run_plan import resolve_plan

    cfg = load_run_config(TINY, ["rollout.max_num_seqs=12"]).config
    spec = replace(resolve_plan(cfg).role_specs().replica, model_dir=str(resolve_model_path("builtin:tiny-qwen")),
                   threads=1)
    actor = RolloutReplica.options(num_cpus=0).remote(spec, 0)
    ray.get(actor.ready.remote())
    yield actor
    ray.kill(actor)


def _reqs(tag: str, count: int, budget: int) -> list[GenRequest]:
    return [GenRequest(f"{tag}{i}", [3 + i % 5, 4, 5, 6], max_new_tokens=budget) for i in range(count)]


def test_concurrent_calls_share_the_batch_and_abort_ends_them_all(replica) -> None:
    import ray

    sampling = SamplingParams(temperature=1.0, seed=1)
    assert ray.get(replica.capacity.remote()) == 12
    first = replica.generate.remote(_reqs("a", 8, 60), sampling)
    second = replica.generate.remote(_reqs("b", 8, 60), sampling)  # 16 rows > 12: 4 wait for a free row
    done = ray.get([replica.generate.remote(_reqs("c", 2, 1), sampling)])[0]  # joins, returns on its own
    assert [len(r.response_ids) for r in done] == [1, 1]
    ray.get(replica.abort.remote())
    results = ray.get([first, second], timeout=60)
    flat = [r for call in results for r in call]
    assert len(flat) == 16 and all(len(r.log_probs) == len(r.response_ids) <= 60 for r in flat)
    assert any(r.finish_reason == "abort" for r in flat)
    # a call made while the flag is set aborts at once; after resume it generates again
    blocked = ray.get(replica.generate.remote(_reqs("d", 2, 4), sampling))
    assert all(r.finish_reason == "abort" and r.response_ids == [] for r in blocked)
    ray.get(replica.resume.remote())
    again = ray.get(replica.generate.remote(_reqs("e", 2, 4), sampling))
    assert all(r.finish_reason in ("stop", "length") and r.response_ids for r in again)
    stats = ray.get(replica.stats.remote())
    assert stats["capacity"] == 12 and 0 < stats["busy_ratio"] <= 1


def test_limits_and_an_abort_that_spares_validation_calls(replica) -> None:
    import ray

    from engine.runtime.replica import GENERATE_CALLS

    assert ray.get(replica.limits.remote()) == {"rows": 12, "calls": GENERATE_CALLS}
    ray.get(replica.resume.remote())
    sampling = SamplingParams(temperature=1.0, seed=3)
    train = replica.generate.remote(_reqs("t", 4, 60), sampling, "train")
    val = replica.generate.remote(_reqs("v", 2, 6), SamplingParams(temperature=0.0), "val")
    ray.get(replica.abort.remote())  # a sync: training calls end, validation finishes
    assert all(len(r.response_ids) <= 60 for r in ray.get(train, timeout=60))
    answers = ray.get(val, timeout=60)
    assert all(r.finish_reason in ("stop", "length") for r in answers)
    # while the training abort holds, validation still starts and finishes; a stop aborts it too
    assert all(r.finish_reason != "abort" for r in ray.get(replica.generate.remote(_reqs("w", 2, 4),
                                                                              SamplingParams(temperature=0.0), "val")))
    ray.get(replica.abort.remote(True))
    cut = ray.get(replica.generate.remote(_reqs("x", 2, 4), SamplingParams(temperature=0.0), "val"))
    assert all(r.finish_reason == "abort" and r.response_ids == [] for r in cut)
    ray.get(replica.resume.remote())
