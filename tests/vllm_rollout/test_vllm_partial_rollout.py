"""vLLM backend partial rollout: abort at a token boundary and resume from the prefix, pause → update →
resume with requests kept in flight, and the resume-continuity self-test."""

from __future__ import annotations

import threading
import time

import pytest
from vllm_tiny_model import have_vllm

if not have_vllm():
    pytest.skip("vllm is not installed (run `make test-vllm`)", allow_module_level=True)

from vllm_tiny_model import greedy, reference_log_probs

from engine.rollout.base import SamplingParams
from engine.types import GenRequest, GenResult

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(300)]

GREEDY = SamplingParams(temperature=0.0)
PROMPTS = [[5, 17, 33, 90, 120], [7, 8, 9, 200, 41, 3, 77]]
BUDGET = 160  # long enough that a pause always lands mid-sequence


def _max_diff(a: list[float], b: list[float]) -> float:
    return max((abs(x - y) for x, y in zip(a, b)), default=0.0)


def _wait_for_tokens(backend, ids: list[str], at_least: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        progress = backend.inflight()
        if all(progress.get(i, 0) >= at_least for i in ids):
            return
        time.sleep(0.002)
    raise AssertionError(f"no progress: {backend.inflight()}")


def _in_thread(backend, requests: list[GenRequest]) -> tuple[threading.Thread, list[list[GenResult]]]:
    out: list[list[GenResult]] = []
    thread = threading.Thread(target=lambda: out.append(backend.generate(requests, GREEDY)))
    thread.start()
    return thread, out


def test_should_abort_returns_partial_tokens_and_resume_from_prefix_completes(backend, load_weights) -> None:
    model, version = load_weights(seed=31, quiet_eos=True)
    prompt = PROMPTS[0]
    reference = greedy(model, prompt, BUDGET, backend.eos_ids)
    assert len(reference) > 40, "precondition: the reference must run long enough to be interrupted"

    req = GenRequest("cut", prompt, max_new_tokens=BUDGET)
    (part,) = backend.generate([req], GREEDY, should_abort=lambda: backend.inflight().get("cut", 0) >= 6)
    k = len(part.response_ids)
    assert part.finish_reason == "abort" and 6 <= k < len(reference)
    assert part.response_ids == reference[:k] and len(part.log_probs) == k == part.new_tokens
    assert part.min_version == part.max_version == version

    rest = GenRequest(
        "cut",
        prompt,
        prefix_ids=part.response_ids,
        prefix_log_probs=part.log_probs,
        max_new_tokens=BUDGET - k,
        min_version=part.min_version,
    )
    (full,) = backend.generate([rest], GREEDY)
    assert full.response_ids == reference, "resumed sequence differs from the uninterrupted one"
    assert full.new_tokens == len(reference) - k
    assert full.log_probs[:k] == part.log_probs
    assert _max_diff(full.log_probs, reference_log_probs(model, prompt, reference, 0.0, 0, 1.0)) < 1e-4
    assert full.min_version == full.max_version == version


def test_generate_during_a_sync_submits_nothing(backend) -> None:
    req = GenRequest(
        "late",
        PROMPTS[0],
        prefix_ids=[9, 10],
        prefix_log_probs=[-0.5, -0.25],
        max_new_tokens=8,
        min_version=0,
    )
    (res,) = backend.generate([req], GREEDY, should_abort=lambda: True)
    assert (res.finish_reason, res.response_ids, res.log_probs, res.new_tokens) == (
        "abort",
        [9, 10],
        [-0.5, -0.25],
        0,
    )
    assert (res.min_version, res.max_version) == (0, backend.version)


def test_pause_keep_update_resume_continues_in_flight_requests_under_new_weights(
    backend, load_weights
) -> None:
    old, v_old = load_weights(seed=41, quiet_eos=True)
    requests = [GenRequest(f"keep{i}", p, max_new_tokens=BUDGET) for i, p in enumerate(PROMPTS)]
    thread, out = _in_thread(backend, requests)
    _wait_for_tokens(backend, [r.request_id for r in requests], 8)
    backend.pause("keep")
    time.sleep(0.2)
    frozen = backend.inflight()
    time.sleep(0.3)
    assert backend.inflight() == frozen, "paused requests kept generating"
    new, v_new = load_weights(seed=42, quiet_eos=True)
    backend.resume()
    thread.join(timeout=120)
    assert not thread.is_alive()

    for req, res in zip(requests, out[0]):
        j = frozen[req.request_id]
        prompt, tokens = req.prompt_ids, res.response_ids
        assert 8 <= j < len(tokens) and res.finish_reason in ("stop", "length")
        assert (res.min_version, res.max_version) == (v_old, v_new)
        # before the pause: the old weights' greedy path; after it: the new weights' greedy continuation of
        # exactly that prefix (a token lost or repeated at the resume breaks this)
        assert tokens[:j] == greedy(old, prompt, j, backend.eos_ids)
        assert tokens[j:] == greedy(new, prompt + tokens[:j], BUDGET - j, backend.eos_ids)
        assert _max_diff(res.log_probs[:j], reference_log_probs(old, prompt, tokens[:j], 0.0, 0, 1.0)) < 1e-4
        assert (
            _max_diff(
                res.log_probs[j:], reference_log_probs(new, prompt + tokens[:j], tokens[j:], 0.0, 0, 1.0)
            )
            < 1e-4
        )


def test_pause_abort_update_resume_from_prefix(backend, load_weights) -> None:
    old, v_old = load_weights(seed=51, quiet_eos=True)
    requests = [GenRequest(f"ab{i}", p, max_new_tokens=BUDGET) for i, p in enumerate(PROMPTS)]
    thread, out = _in_thread(backend, requests)
    _wait_for_tokens(backend, [r.request_id for r in requests], 5)
    backend.pause("abort")
    thread.join(timeout=60)
    partials = out[0]
    new, v_new = load_weights(seed=52, quiet_eos=True)  # while paused: the update must not resume the engine
    backend.resume()

    resumed = [
        GenRequest(
            p.request_id,
            q.prompt_ids,
            prefix_ids=p.response_ids,
            prefix_log_probs=p.log_probs,
            max_new_tokens=BUDGET - len(p.response_ids),
            min_version=p.min_version,
        )
        for q, p in zip(requests, partials)
    ]
    finals = backend.generate(resumed, GREEDY)
    for req, part, res in zip(requests, partials, finals):
        k = len(part.response_ids)
        assert part.finish_reason == "abort" and 5 <= k < BUDGET
        assert part.response_ids == greedy(old, req.prompt_ids, k, backend.eos_ids)
        assert res.response_ids[:k] == part.response_ids and res.log_probs[:k] == part.log_probs
        tail = res.response_ids[k:]
        assert tail == greedy(new, req.prompt_ids + part.response_ids, BUDGET - k, backend.eos_ids)
        ref = reference_log_probs(new, req.prompt_ids + part.response_ids, tail, 0.0, 0, 1.0)
        assert _max_diff(res.log_probs[k:], ref) < 1e-4
        assert (res.min_version, res.max_version, res.new_tokens) == (v_old, v_new, len(tail))


def test_resume_continuity_self_test_passes(backend, load_weights) -> None:
    load_weights(seed=71)
    report = backend.self_test_resume_continuity(n_tokens=48, interrupt_after=8)
    assert report.ok, report
    assert 8 <= report.aborted_after < 48 and 8 <= report.kept_after < 48
    assert report.resumed_after_abort == report.continued_after_keep == report.reference
    assert len(report.reference) == 48
