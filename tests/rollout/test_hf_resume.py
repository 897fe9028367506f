"""Partial rollout on the `hf` backend: interruption at a token boundary, then resumption from the prefix.

With unchanged weights and greedy decoding, abort-after-k-tokens + resume must reproduce the uninterrupted
run token for token, with the same log-probs; budgets are cumulative across resumes."""

from __future__ import annotations

import pytest
import torch

from engine.rollout.base import SamplingParams
from engine.rollout.hf.backend import HFRolloutBackend
from engine.types import GenRequest, GenResult

PAD, EOS = 0, 1
BUDGET = 12


class AbortAfterTokens:
    """`should_abort` that turns True at the boundary after `k` tokens.

    The backend polls once before the prefill and once before each token, so the (k + 2)-th poll is the
    boundary after the k-th token."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.calls = 0

    def __call__(self) -> bool:
        self.calls += 1
        return self.calls >= self.k + 2


def resume_request(req: GenRequest, partial: GenResult) -> GenRequest:
    return GenRequest(
        request_id=req.request_id,
        prompt_ids=req.prompt_ids,
        prefix_ids=partial.response_ids,
        prefix_log_probs=partial.log_probs,
        max_new_tokens=req.max_new_tokens - len(partial.response_ids),
        min_version=partial.min_version,
    )


def make_requests() -> list[GenRequest]:
    gen = torch.Generator().manual_seed(5)
    reqs = []
    for i in range(6):
        length = 3 + i
        reqs.append(GenRequest(f"r{i}", torch.randint(2, 32, (length,), generator=gen).tolist(), max_new_tokens=BUDGET))
    return reqs


@pytest.mark.parametrize("max_batch_size", [64, 2])
@pytest.mark.parametrize("k", [0, 1, 3, 7])
def test_greedy_abort_then_resume_equals_uninterrupted(tiny_lm, k: int, max_batch_size: int) -> None:
    backend = HFRolloutBackend(tiny_lm(), eos_token_id=EOS, pad_token_id=PAD, max_batch_size=max_batch_size)
    greedy = SamplingParams(temperature=0.0)
    reqs = make_requests()
    full = backend.generate(reqs, greedy)
    partial = backend.generate(reqs, greedy, should_abort=AbortAfterTokens(k))
    first_chunk = min(max_batch_size, len(reqs))
    for res, ref in zip(partial, full):
        if res.finish_reason == "abort":
            assert res.response_ids == ref.response_ids[: len(res.response_ids)]
            assert res.log_probs == pytest.approx(ref.log_probs[: len(res.log_probs)], abs=1e-5)
        else:
            assert res.response_ids == ref.response_ids and len(res.response_ids) <= k
    # every row of the first chunk that had not finished holds exactly k tokens; later chunks never started
    chunk_rows = sorted(range(len(reqs)), key=lambda i: len(reqs[i].prompt_ids))[:first_chunk]
    for i in chunk_rows:
        if partial[i].finish_reason == "abort":
            assert len(partial[i].response_ids) == k
    resumed_reqs = [resume_request(r, p) if p.finish_reason == "abort" else None for r, p in zip(reqs, partial)]
    todo = [r for r in resumed_reqs if r is not None]
    assert todo, "the abort must interrupt something"
    resumed = {r.request_id: r for r in backend.generate(todo, greedy)}
    for req, part, ref in zip(reqs, partial, full):
        final = resumed.get(req.request_id, part)
        assert final.response_ids == ref.response_ids
        assert final.log_probs == pytest.approx(ref.log_probs, abs=1e-5)
        assert final.finish_reason == ref.finish_reason


def test_abort_before_prefill_returns_empty_partials(tiny_lm) -> None:
    backend = HFRolloutBackend(tiny_lm(), eos_token_id=EOS, pad_token_id=PAD)
    results = backend.generate(make_requests(), SamplingParams(temperature=1.0, seed=0), should_abort=lambda: True)
    assert all(r.finish_reason == "abort" and r.response_ids == [] and r.new_tokens == 0 for r in results)
    assert backend.stats()["prefill_tokens"] == 0


def test_budget_is_cumulative_across_many_resumes_and_versions(tiny_lm) -> None:
    backend = HFRolloutBackend(tiny_lm(), eos_token_id=EOS, pad_token_id=PAD)
    sampling = SamplingParams(temperature=1.0, seed=3)
    original = make_requests()
    pending = {r.request_id: r for r in original}
    finished: dict[str, GenResult] = {}
    first_version: dict[str, int] = {}
    rounds = 0
    while pending:
        rounds += 1
        assert rounds < 50
        out = backend.generate(list(pending.values()), sampling, should_abort=AbortAfterTokens(2))
        for res in out:
            req = pending.pop(res.request_id)
            if res.response_ids:
                first_version.setdefault(res.request_id, res.min_version)
                assert res.min_version == first_version[res.request_id]
            assert res.max_version == backend.version
            if res.finish_reason == "abort":
                pending[res.request_id] = GenRequest(
                    req.request_id, req.prompt_ids, res.response_ids, res.log_probs,
                    max_new_tokens=BUDGET - len(res.response_ids),
                    min_version=res.min_version if res.response_ids else None,
                )
            else:
                finished[res.request_id] = res
        backend.version += 1  # pretend a weight sync happened between rounds (weights unchanged)
    assert rounds > 3
    for res in finished.values():
        assert len(res.response_ids) == len(res.log_probs) <= BUDGET
        if res.finish_reason == "length":
            assert len(res.response_ids) == BUDGET
        else:
            assert res.response_ids[-1] == EOS
    assert any(r.max_version > r.min_version for r in finished.values())
