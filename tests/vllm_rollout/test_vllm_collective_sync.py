"""`rollout.weight_sync = "collective"` into vLLM: the replica's worker joins the trainer's gloo broadcast group
itself (`vllm_worker_ext.asyncrl_receive_collective`) and loads the buckets as they arrive; afterwards the
replica samples with the log-probs of the weights the trainer sent, version after version."""

from __future__ import annotations

import threading

import pytest
from vllm_tiny_model import have_vllm

if not have_vllm():
    pytest.skip("vllm is not installed (run `make test-vllm`)", allow_module_level=True)

from vllm_tiny_model import hf_buckets, make_model, reference_log_probs

from engine.rollout.base import SamplingParams
from engine.sync.collective import CollectiveSync
from engine.sync.runtime import resolve_buckets
from engine.types import GenRequest

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(300)]

PROMPTS = [[5, 17, 33, 90, 120], [7, 8, 9, 200, 41, 3, 77]]


def test_collective_sync_into_the_vllm_worker_matches_the_trainer_weights(backend, tiny, monkeypatch) -> None:
    from engine.rollout.vllm import backend as vllm_backend
    from engine.trainer.fsdp import free_port

    def no_driver_copy(*_: object) -> None:
        raise AssertionError("the buckets went through the replica's driver, not the worker's group")

    monkeypatch.setattr(vllm_backend, "send_bucket", no_driver_copy)

    # replica 1 of 2 (one TP-1 worker each): group rank 2; rank 1 (replica 0) is this test's other receiver
    sync = CollectiveSync("127.0.0.1", free_port(), world=3)
    other: list[int] = []

    def replica_zero(handle) -> None:
        other.append(sum(b.nbytes for b in resolve_buckets([handle], 0)))

    sampling = SamplingParams(temperature=0.8, top_k=0, top_p=1.0, seed=5)
    for step, seed in enumerate((101, 202)):
        model = make_model(tiny.vocab_size, tiny.eos_id, tiny.pad_id, seed=seed)
        handle = sync.announce(version=100 + step)
        sender = threading.Thread(target=sync.send, args=(handle, hf_buckets(model, 3)))
        peer = threading.Thread(target=replica_zero, args=(handle,))
        sender.start()
        peer.start()
        before = backend.stats()["weight_update_bytes"]
        delivery = resolve_buckets([handle], 1)
        backend.update_weights(delivery, handle.version)
        sender.join(60)
        peer.join(60)
        assert not sender.is_alive() and not peer.is_alive()
        assert backend.version == handle.version and handle.num_buckets == 3
        assert delivery.fingerprints == handle.fingerprints  # the worker's receipt: every bucket, bit-exact
        # the worker received every byte sent (plus the tied head it adds), as did the other replica
        assert other[-1] == handle.nbytes
        assert backend.stats()["weight_update_bytes"] - before >= handle.nbytes

        requests = [GenRequest(f"c{step}-{i}", p, max_new_tokens=16) for i, p in enumerate(PROMPTS)]
        for req, res in zip(requests, backend.generate(requests, sampling)):
            assert res.min_version == res.max_version == handle.version
            ref = reference_log_probs(model, req.prompt_ids, res.response_ids, 0.8, 0, 1.0)
            diff = max(abs(a - b) for a, b in zip(ref, res.log_probs))
            assert diff < 1e-4, f"{req.request_id}: max |Δ log-prob| = {diff:.2e}"
