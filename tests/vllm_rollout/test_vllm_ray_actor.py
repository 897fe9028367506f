"""The vLLM backend inside a threaded Ray actor, as a rollout replica runs it: its own engine process
spawned from the actor, weights from object-store refs (read-only numpy), and an abort that lands from a
second actor thread while `generate` runs."""

from __future__ import annotations

import time
from typing import Any

import pytest
from vllm_tiny_model import have_vllm

if not have_vllm():
    pytest.skip("vllm is not installed (run `make test-vllm`)", allow_module_level=True)

from vllm_tiny_model import greedy, hf_buckets, make_model

from engine.rollout.base import SamplingParams
from engine.types import GenRequest

pytestmark = [pytest.mark.vllm, pytest.mark.integration, pytest.mark.timeout(300)]


def _replica_class() -> type:
    """Defined in a function so Ray ships the class by value (the test module is not importable there)."""
    import threading

    class Replica:
        def __init__(self, model_dir: str) -> None:
            from engine.rollout.vllm.backend import VLLMRolloutBackend

            self.backend = VLLMRolloutBackend(
                model_dir, dtype="float32", max_model_len=512, max_num_seqs=8, kv_cache_gib=1, device="cpu"
            )
            self.stop = threading.Event()

        def update(self, bucket_refs: list[Any], version: int) -> int:
            import ray

            self.backend.update_weights([ray.get(r) for r in bucket_refs], version)
            self.stop.clear()
            return self.backend.version

        def generate(self, requests: list[GenRequest], sampling: SamplingParams) -> list[Any]:
            return self.backend.generate(requests, sampling, should_abort=self.stop.is_set)

        def progress(self) -> dict[str, int]:
            return self.backend.inflight()

        def abort(self) -> None:
            self.stop.set()

        def close(self) -> None:
            self.backend.close()

    return Replica


def test_backend_in_a_ray_actor_updates_from_object_refs_and_aborts_from_another_thread(tiny) -> None:
    import ray

    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=200 * 1024 * 1024,
        runtime_env={"env_vars": {"HF_HUB_OFFLINE": "1"}},
        log_to_driver=False,
    )
    try:
        actor = ray.remote(num_cpus=1, max_concurrency=2)(_replica_class()).remote(str(tiny.path))
        model = make_model(tiny.vocab_size, tiny.eos_id, tiny.pad_id, seed=81, quiet_eos=True)
        refs = [ray.put(bucket) for bucket in hf_buckets(model, 2)]
        assert ray.get(actor.update.remote(refs, 5), timeout=240) == 5

        prompt = [5, 17, 33, 90, 120]
        expected = greedy(model, prompt, 200, {tiny.eos_id})
        (res,) = ray.get(
            actor.generate.remote(
                [GenRequest("a", prompt, max_new_tokens=24)], SamplingParams(temperature=0.0)
            )
        )
        assert res.response_ids == expected[:24] and (res.min_version, res.max_version) == (5, 5)

        pending = actor.generate.remote(
            [GenRequest("b", prompt, max_new_tokens=200)], SamplingParams(temperature=0.0)
        )
        deadline = time.monotonic() + 60
        while ray.get(actor.progress.remote()).get("b", 0) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        ray.get(actor.abort.remote())
        (part,) = ray.get(pending, timeout=60)
        assert part.finish_reason == "abort" and 4 <= len(part.response_ids) < 200
        assert part.response_ids == expected[: len(part.response_ids)]
        ray.get(actor.close.remote(), timeout=60)
    finally:
        ray.shutdown()
