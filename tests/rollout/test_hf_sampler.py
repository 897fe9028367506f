"""The `hf` rollout backend: EOS/budget stops, batching, dedup, seeds, version stamps, agreement with
transformers' greedy `generate`."""

from __future__ import annotations

import pytest
import torch

from engine.rollout.base import RolloutBackend, SamplingParams
from engine.rollout.hf.backend import HFRolloutBackend
from engine.types import GenRequest

PAD, EOS = 0, 1


def prompts(count: int, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(2, 32, (int(torch.randint(3, 10, (1,), generator=gen)),), generator=gen).tolist()
            for _ in range(count)]


def requests(ps: list[list[int]], n: int, budget: int) -> list[GenRequest]:
    return [GenRequest(f"{i}/{j}", p, max_new_tokens=budget) for i, p in enumerate(ps) for j in range(n)]


def test_is_a_rollout_backend(tiny_lm) -> None:
    assert isinstance(HFRolloutBackend(tiny_lm(), eos_token_id=EOS, pad_token_id=PAD), RolloutBackend)


def test_greedy_equals_transformers_generate(tiny_lm) -> None:
    model = tiny_lm()
    backend = HFRolloutBackend(model, eos_token_id=EOS, pad_token_id=PAD, max_batch_size=3)
    ps = prompts(5)
    results = backend.generate(requests(ps, 1, 12), SamplingParams(temperature=0.0))
    for p, res in zip(ps, results):
        with torch.no_grad():
            ref = model.generate(torch.tensor([p]), max_new_tokens=12, do_sample=False, eos_token_id=EOS,
                                 pad_token_id=PAD)[0, len(p):].tolist()
        if EOS in ref:
            ref = ref[: ref.index(EOS) + 1]
        assert res.response_ids == ref
        assert res.finish_reason == ("stop" if ref[-1] == EOS else "length")


def test_eos_stops_a_row_and_budget_bounds_the_rest(tiny_lm) -> None:
    backend = HFRolloutBackend(tiny_lm(), eos_token_id=EOS, pad_token_id=PAD)
    results = backend.generate(requests(prompts(8), 8, 10), SamplingParams(temperature=1.5, seed=0))
    reasons = {r.finish_reason for r in results}
    assert reasons == {"stop", "length"}
    for r in results:
        assert len(r.response_ids) == len(r.log_probs) == r.new_tokens <= 10
        assert EOS not in r.response_ids[:-1]
        if r.finish_reason == "stop":
            assert r.response_ids[-1] == EOS
        else:
            assert len(r.response_ids) == 10 and r.response_ids[-1] != EOS
        assert all(lp <= 0.0 for lp in r.log_probs)


def test_finished_rows_leave_the_batch_and_shared_prompts_prefill_once(tiny_lm) -> None:
    backend = HFRolloutBackend(tiny_lm(), eos_token_id=EOS, pad_token_id=PAD)
    ps = prompts(3)
    results = backend.generate(requests(ps, 6, 16), SamplingParams(temperature=1.5, seed=1))
    stats = backend.stats()
    assert stats["prefill_tokens"] == sum(len(p) for p in ps)
    # one decode row-step per generated token: finished rows cost nothing afterwards
    assert stats["decode_row_steps"] == stats["tokens_generated"] == sum(r.new_tokens for r in results)
    assert stats["requests"] == 18 and stats["finished_stop"] + stats["finished_length"] == 18


def test_seed_makes_sampling_reproducible_and_batch_size_does_not_matter_for_greedy(tiny_lm) -> None:
    model = tiny_lm()
    a = HFRolloutBackend(model, eos_token_id=EOS, pad_token_id=PAD)
    reqs = requests(prompts(4), 4, 8)
    first = a.generate(reqs, SamplingParams(temperature=1.0, seed=7))
    again = a.generate(reqs, SamplingParams(temperature=1.0, seed=7))
    other = a.generate(reqs, SamplingParams(temperature=1.0, seed=8))
    assert [r.response_ids for r in first] == [r.response_ids for r in again]
    assert [r.response_ids for r in first] != [r.response_ids for r in other]
    small = HFRolloutBackend(model, eos_token_id=EOS, pad_token_id=PAD, max_batch_size=1)
    big = a.generate(reqs, SamplingParams(temperature=0.0))
    one_by_one = small.generate(reqs, SamplingParams(temperature=0.0))
    assert [r.response_ids for r in big] == [r.response_ids for r in one_by_one]
    for x, y in zip(big, one_by_one):
        assert x.log_probs == pytest.approx(y.log_probs, abs=1e-5)


def test_results_come_back_in_request_order_with_version_stamps(tiny_lm) -> None:
    backend = HFRolloutBackend(tiny_lm(), eos_token_id=EOS, pad_token_id=PAD)
    backend.version = 3
    reqs = [
        GenRequest("long", list(range(2, 12)), max_new_tokens=4),
        GenRequest("resumed", [5, 6, 7], prefix_ids=[8, 9], prefix_log_probs=[-1.0, -2.0], max_new_tokens=3,
                   min_version=1),
        GenRequest("short", [4], max_new_tokens=2),
        GenRequest("done", [4], prefix_ids=[3, EOS], prefix_log_probs=[-0.5, -0.25], max_new_tokens=5, min_version=2),
        GenRequest("no-budget", [4], prefix_ids=[3], prefix_log_probs=[-0.5], max_new_tokens=0, min_version=2),
    ]
    results = backend.generate(reqs, SamplingParams(temperature=0.0))
    assert [r.request_id for r in results] == ["long", "resumed", "short", "done", "no-budget"]
    assert [(r.min_version, r.max_version) for r in results] == [(3, 3), (1, 3), (3, 3), (2, 3), (2, 3)]
    resumed = results[1]
    assert resumed.response_ids[:2] == [8, 9] and resumed.log_probs[:2] == [-1.0, -2.0]
    assert resumed.new_tokens == len(resumed.response_ids) - 2 <= 3
    assert results[3].finish_reason == "stop" and results[3].new_tokens == 0
    assert results[4].finish_reason == "length" and results[4].response_ids == [3]


def test_rejects_prefix_without_log_probs(tiny_lm) -> None:
    backend = HFRolloutBackend(tiny_lm(), eos_token_id=EOS, pad_token_id=PAD)
    with pytest.raises(ValueError):
        backend.generate([GenRequest("x", [2], prefix_ids=[3], max_new_tokens=2)], SamplingParams())
