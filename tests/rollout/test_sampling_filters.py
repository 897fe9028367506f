"""top-k / top-p filtering and the reported log-probs of `engine.rollout.hf.sampling`."""

from __future__ import annotations

import math

import torch

from engine.rollout.base import SamplingParams
from engine.rollout.hf.sampling import filter_logits, sample_from_cdf, select_tokens


def test_top_k_keeps_exactly_k_highest() -> None:
    logits = torch.tensor([[0.1, 3.0, 2.0, -1.0, 2.5]])
    kept = torch.isfinite(filter_logits(logits, top_k=2, top_p=1.0))
    assert kept.tolist() == [[False, True, False, False, True]]


def test_top_p_keeps_smallest_nucleus_reaching_p() -> None:
    probs = torch.tensor([[0.2, 0.5, 0.3]])
    # sorted: 0.5, 0.3, 0.2 -> mass before: 0, 0.5, 0.8 -> p=0.6 keeps the first two
    kept = torch.isfinite(filter_logits(probs.log(), top_k=0, top_p=0.6))
    assert kept.tolist() == [[False, True, True]]
    # p smaller than the top probability still keeps the top token
    kept = torch.isfinite(filter_logits(probs.log(), top_k=0, top_p=0.1))
    assert kept.tolist() == [[False, True, False]]


def test_sampled_log_probs_are_renormalised_over_the_kept_set() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]]).repeat(64, 1)
    gen = torch.Generator().manual_seed(0)
    tokens, log_probs = select_tokens(logits, SamplingParams(temperature=0.5, top_k=2), gen)
    assert set(tokens.tolist()) <= {0, 1}
    z = torch.tensor([2.0, 1.0]) / 0.5
    expected = torch.log_softmax(z, dim=-1)
    for t, lp in zip(tokens.tolist(), log_probs.tolist()):
        assert math.isclose(lp, float(expected[t]), abs_tol=1e-6)


def test_unfiltered_log_probs_equal_tempered_log_softmax() -> None:
    logits = torch.randn(16, 32, generator=torch.Generator().manual_seed(1))
    tokens, log_probs = select_tokens(logits, SamplingParams(temperature=0.7), torch.Generator().manual_seed(2))
    expected = torch.log_softmax(logits / 0.7, dim=-1).gather(-1, tokens[:, None]).squeeze(-1)
    assert torch.allclose(log_probs, expected, atol=1e-6)


def test_greedy_takes_argmax_and_reports_temperature_one() -> None:
    logits = torch.tensor([[0.0, 4.0, 1.0], [3.0, 0.0, 0.0]])
    tokens, log_probs = select_tokens(logits, SamplingParams(temperature=0.0, top_k=1, top_p=0.1), None)
    assert tokens.tolist() == [1, 0]
    assert torch.allclose(log_probs, torch.log_softmax(logits, -1)[[0, 1], [1, 0]])


def test_sampling_frequencies_follow_the_distribution() -> None:
    logits = torch.tensor([[math.log(0.7), math.log(0.2), math.log(0.1)]]).repeat(20000, 1)
    tokens, _ = select_tokens(logits, SamplingParams(temperature=1.0), torch.Generator().manual_seed(3))
    freq = torch.bincount(tokens, minlength=3).float() / tokens.numel()
    assert torch.allclose(freq, torch.tensor([0.7, 0.2, 0.1]), atol=0.015)


def test_cdf_sampling_never_returns_zero_probability_tokens() -> None:
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.5, 0.0]]).repeat(5000, 1)
    tokens = sample_from_cdf(probs, torch.Generator().manual_seed(0))
    assert set(tokens.tolist()) == {1, 3}
    assert abs(float((tokens == 1).float().mean()) - 0.5) < 0.03
