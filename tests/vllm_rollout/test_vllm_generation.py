"""vLLM backend: sampled-token log-probs under the sampling distribution, and in-place weight updates."""

from __future__ import annotations

import pytest
from vllm_tiny_model import have_vllm

if not have_vllm():
    pytest.skip("vllm is not installed (run `make test-vllm`)", allow_module_level=True)

from vllm_tiny_model import greedy, reference_log_probs

from engine.rollout.base import RolloutBackend, SamplingParams
from engine.types import GenRequest

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(300)]

PROMPTS = [[5, 17, 33, 90, 120], [7, 8, 9, 200, 41, 3, 77]]


def test_backend_satisfies_the_protocol(backend) -> None:
    assert isinstance(backend, RolloutBackend)
    assert backend.tied_embeddings


@pytest.mark.parametrize(
    "temperature,top_k,top_p",
    [(1.0, 0, 1.0), (0.7, 20, 0.9), (0.0, 0, 1.0)],
    ids=["plain", "temp-topk-topp", "greedy"],
)
def test_log_probs_match_an_fp32_torch_forward(backend, load_weights, temperature, top_k, top_p) -> None:
    model, version = load_weights(seed=11)
    sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=3)
    requests = [
        GenRequest(f"p{p}-s{s}", prompt, max_new_tokens=24)
        for p, prompt in enumerate(PROMPTS)
        for s in range(4)
    ]
    results = backend.generate(requests, sampling)

    assert [r.request_id for r in results] == [q.request_id for q in requests]
    for req, res in zip(requests, results):
        assert res.finish_reason in ("stop", "length")
        assert 0 < len(res.response_ids) == len(res.log_probs) == res.new_tokens <= 24
        assert res.min_version == res.max_version == version
        ref = reference_log_probs(model, req.prompt_ids, res.response_ids, temperature, top_k, top_p)
        diff = max(abs(a - b) for a, b in zip(ref, res.log_probs))
        assert diff < 1e-4, f"{req.request_id}: max |Δ log-prob| = {diff:.2e}"
    if temperature > 0:
        # n samples of one prompt are distinct draws, and a seed reproduces them
        assert len({tuple(r.response_ids) for r in results[:4]}) > 1
        again = backend.generate(requests, sampling)
        assert [r.response_ids for r in again] == [r.response_ids for r in results]


@pytest.mark.parametrize("flat", [False, True])
def test_greedy_after_weight_update_equals_transformers(backend, load_weights, flat) -> None:
    old, _ = load_weights(seed=21, flat=flat)
    new, version = load_weights(seed=61, n_buckets=4, flat=flat)  # PROMPTS[0] hits EOS after 3 tokens
    requests = [GenRequest(f"g{i}", prompt, max_new_tokens=32) for i, prompt in enumerate(PROMPTS)]
    results = backend.generate(requests, SamplingParams(temperature=0.0))

    assert backend.version == version
    for req, res in zip(requests, results):
        expected = greedy(new, req.prompt_ids, 32, backend.eos_ids)
        assert res.response_ids == expected
        assert res.finish_reason == ("stop" if expected[-1] in backend.eos_ids else "length")
        assert res.min_version == res.max_version == version
    assert [r.finish_reason for r in results] == ["stop", "length"]
    stale = [greedy(old, q.prompt_ids, 32, backend.eos_ids) for q in requests]
    assert stale != [r.response_ids for r in results], "the two weight sets must be distinguishable"
    stats = backend.stats()
    assert stats["weight_updates"] >= 2 and stats["weight_update_bytes"] > 0 and stats["tokens_generated"] > 0


def test_prefix_ending_in_eos_and_exhausted_budget_return_without_generating(backend) -> None:
    eos = min(backend.eos_ids)
    done = GenRequest(
        "done",
        PROMPTS[0],
        prefix_ids=[11, eos],
        prefix_log_probs=[-1.0, -2.0],
        max_new_tokens=5,
        min_version=0,
    )
    spent = GenRequest(
        "spent", PROMPTS[0], prefix_ids=[11], prefix_log_probs=[-1.0], max_new_tokens=0, min_version=0
    )
    a, b = backend.generate([done, spent], SamplingParams())
    assert (a.finish_reason, a.response_ids, a.log_probs, a.new_tokens) == (
        "stop",
        [11, eos],
        [-1.0, -2.0],
        0,
    )
    assert (b.finish_reason, b.response_ids, b.new_tokens, b.min_version) == ("length", [11], 0, 0)
