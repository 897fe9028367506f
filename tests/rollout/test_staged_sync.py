"""A staged weight sync on a real `hf` replica actor (`rollout.weight_sync_back_buffer`, `engine.sync.staging`),
through the shared-memory transport the engine uses on one CPU host: the replica receives the new weights
while it is generating and keeps generating with the old ones; what it generated before the swap carries the
old version, what it generates after the swap the new one; its receipt passes the trainer's delivery check
and its live weights are exactly the sender's; a bucket corrupted on the way fails the check naming the
replica and the bucket; a swap of a version that was not staged is refused."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from asyncrl_cli.config.loader import load_run_config
from engine.rollout.base import SamplingParams
from engine.types import GenRequest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
TINY = Path(__file__).resolve().parents[2] / "presets" / "runs" / "tiny-cpu.toml"


@pytest.fixture(scope="module")
def setup():
    import ray

    from engine.models.loader import load_causal_lm, resolve_model_path
    from engine.plan.run_plan import resolve_plan
    from engine.runtime.backends import rollout_dtype
    from engine.runtime.replica import RolloutReplica
    from engine.sync.shared_memory import SharedMemorySync
    from engine.trainer.fsdp import free_port

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR",
                 object_store_memory=256 * 2**20)
    model_dir = resolve_model_path("builtin:tiny-qwen")
    cfg = load_run_config(TINY, ["rollout.max_num_seqs=8", 'rollout.weight_sync_back_buffer="on"']).config
    spec = replace(resolve_plan(cfg).role_specs().replica, model_dir=str(model_dir), threads=1)
    actor = RolloutReplica.options(num_cpus=0).remote(spec, 0)
    ray.get(actor.ready.remote())
    sender = load_causal_lm(model_dir, dtype=rollout_dtype(cfg))  # the trainer's copy, same dtype and names
    sync = SharedMemorySync("127.0.0.1", free_port(), 2, run_id=f"staged{os.getpid()}", slot_bytes=64 * 1024)
    yield actor, sender, sync
    sync.close()
    ray.kill(actor)
    if started:
        ray.shutdown()


def _buckets(model: torch.nn.Module) -> list[dict[str, torch.Tensor]]:
    sd = {k: v.detach() for k, v in model.state_dict().items()}
    names = sorted(sd)
    return [{n: sd[n] for n in names[i:i + 4]} for i in range(0, len(names), 4)]


def _stage(actor, sync, sender, version: int, corrupt: int | None = None):
    import ray

    from engine.sync.runtime import publish

    sent = publish(sync, version, _buckets(sender), lambda refs: actor.stage_weights.remote(refs, version),
                   corrupt_bucket=corrupt)
    ray.get(sent.out)
    return sent


def test_staged_while_generating_old_tokens_old_version_then_swapped_and_verified(setup) -> None:
    import ray

    from engine.sync.verify import DeliveryCheck, weights_fingerprint

    actor, sender, sync = setup
    assert ray.get(actor.stages_weights.remote()) is True
    check = DeliveryCheck()
    with torch.no_grad():
        for p in sender.parameters():
            p.add_(0.01)
    reqs = [GenRequest(f"r{i}", [3 + i, 4, 5], max_new_tokens=4000) for i in range(6)]
    running = actor.generate.remote(reqs, SamplingParams(temperature=1.0, seed=1))
    sent = _stage(actor, sync, sender, 1)  # received while the rows above keep decoding
    assert not ray.wait([running], timeout=0)[0], "generation stopped while the replica staged"
    assert ray.get(actor.version.remote()) == 0  # staged, not live
    ray.get(actor.abort.remote())  # the sync's pause: generation drains at the next token boundary
    old = ray.get(running, timeout=120)
    assert all(r.finish_reason == "abort" and r.min_version == r.max_version == 0 for r in old)
    receipt = ray.get(actor.swap_weights.remote(1))
    assert check.check(1, sent.fingerprints, {0: receipt}, sent.names) == []  # every bucket as sent
    assert receipt["weights"] == weights_fingerprint(sender.state_dict().values())  # live = the sender's weights
    assert ray.get(actor.version.remote()) == 1
    new = ray.get(actor.generate.remote([GenRequest("n", [3, 4, 5], max_new_tokens=3)],
                                        SamplingParams(temperature=1.0, seed=2)), timeout=120)
    assert new[0].min_version == new[0].max_version == 1 and new[0].response_ids
    # a resumed row keeps its old prefix's version as min_version, and is stamped new from the swap on
    resumed = ray.get(actor.generate.remote([GenRequest("r0", reqs[0].prompt_ids, prefix_ids=old[0].response_ids,
                                                        prefix_log_probs=old[0].log_probs, max_new_tokens=2,
                                                        min_version=0)],
                                            SamplingParams(temperature=1.0, seed=3)), timeout=120)
    assert resumed[0].min_version == 0 and resumed[0].max_version == 1

    # v2 corrupted on the way: the delivery check names the replica and the bucket
    with torch.no_grad():
        for p in sender.parameters():
            p.add_(0.01)
    sent = _stage(actor, sync, sender, 2, corrupt=1)
    receipt = ray.get(actor.swap_weights.remote(2))
    from engine.sync.verify import SyncDeliveryError

    with pytest.raises(SyncDeliveryError, match=r"rollout replica 0 loaded bucket 1 \("):
        check.check(2, sent.fingerprints, {0: receipt}, sent.names)

    # a swap of a version that was not staged is refused, and the live version stays
    with pytest.raises(ray.exceptions.RayTaskError, match="asked to swap in weights v3, staged nothing"):
        ray.get(actor.swap_weights.remote(3))
    assert ray.get(actor.version.remote()) == 2
