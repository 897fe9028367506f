"""Weight sync through a real local Ray object store: trainer export (model dtype) → flat buckets → push → a
replica actor pulls them zero-copy (its tensors are views of shared memory) and loads them into its `hf`
sampler."""

from __future__ import annotations

import copy

import pytest
import torch

from engine.rollout.base import SamplingParams
from engine.rollout.hf.backend import HFRolloutBackend
from engine.sync.base import WeightSync
from engine.trainer.torch_trainer import TorchTrainerBackend
from engine.types import GenRequest

ray = pytest.importorskip("ray")

PAD, EOS = 0, 1
REQUESTS = [GenRequest(str(i), [2 + i, 9, 4 + i], max_new_tokens=10) for i in range(4)]


@pytest.fixture
def local_ray():
    ray.init(address="local", num_cpus=1, include_dashboard=False, object_store_memory=80 * 1024 * 1024,
             log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_object_store_sync_updates_a_remote_replica(local_ray, tiny_lm) -> None:
    from engine.sync.object_store import ObjectStoreSync

    @ray.remote(num_cpus=1)
    class Replica:
        def __init__(self, model: torch.nn.Module) -> None:
            torch.set_num_threads(1)
            self.backend = HFRolloutBackend(model, eos_token_id=EOS, pad_token_id=PAD)
            self.sync = ObjectStoreSync()

        def apply(self, handle) -> dict:
            from engine.sync.verify import Delivery

            delivery = Delivery(self.sync.pull(handle))
            self.backend.update_weights(delivery, handle.version)
            return {"version": self.backend.version, "fingerprints": delivery.fingerprints}

        def greedy(self) -> list[list[int]]:
            return [r.response_ids for r in self.backend.generate(REQUESTS, SamplingParams(temperature=0.0))]

    sync = ObjectStoreSync()
    assert isinstance(sync, WeightSync)
    policy = tiny_lm(seed=3)
    trainer = TorchTrainerBackend(copy.deepcopy(policy), optim_cfg={"lr": 1e-3})
    replica = Replica.remote(tiny_lm(seed=4))
    before = ray.get(replica.greedy.remote())
    handle = sync.push(7, trainer.export_weights(bucket_bytes=64 * 1024))
    assert handle.num_buckets > 1
    assert handle.nbytes == sum(t.numel() * t.element_size() for t in policy.state_dict().values())
    info = ray.get(replica.apply.remote(handle))
    assert info == {"version": 7, "fingerprints": handle.fingerprints}  # every bucket arrived as sent
    expected = HFRolloutBackend(policy, eos_token_id=EOS, pad_token_id=PAD).generate(
        REQUESTS, SamplingParams(temperature=0.0))
    after = ray.get(replica.greedy.remote())
    assert after == [r.response_ids for r in expected] and after != before
    pulled = list(sync.pull(handle))
    exported = list(trainer.export_weights(bucket_bytes=64 * 1024))
    assert [b.names for b in pulled] == [list(b) for b in exported]
    assert all(t.dtype == e[k].dtype and torch.equal(t, e[k]) for p, e in zip(pulled, exported) for k, t in p.tensors())
    # the export is zero-copy, the push is not: training on after the push leaves the pushed version intact
    kept = {k: a.clone() for b in exported for k, a in b.items()}
    with torch.no_grad():
        trainer.model.model.embed_tokens.weight.add_(1.0)
    assert not torch.equal(exported[0]["model.embed_tokens.weight"], kept["model.embed_tokens.weight"])
    assert all(torch.equal(t, kept[k]) for b in sync.pull(handle) for k, t in b.tensors())
    sync.release(handle)
    assert handle.refs == []
