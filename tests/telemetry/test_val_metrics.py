"""Validation at n answers per prompt: verl's mean@n / best@k / worst@k / maj@k, against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from engine.telemetry.val_metrics import (
    Answer,
    bootstrap_indices,
    majority_value,
    prompt_metrics,
    subset_sizes,
    validation_metrics,
)


def test_subset_sizes_are_verls_powers_of_two_below_n_then_n() -> None:
    assert subset_sizes(1) == []
    assert subset_sizes(2) == [2]
    assert subset_sizes(4) == [2, 4]
    assert subset_sizes(5) == [2, 4, 5]
    assert subset_sizes(30) == [2, 4, 8, 16, 30]


def test_one_answer_gives_mean_at_1_only() -> None:
    assert prompt_metrics([0.25]) == {"mean@1": 0.25}


def test_mean_and_population_std_over_the_n_answers_by_hand() -> None:
    m = prompt_metrics([1.0, 0.0, 0.0, 1.0])
    assert m["mean@4"] == 0.5
    assert m["std@4"] == 0.5  # sqrt(((0.5)^2 * 4) / 4)
    m3 = prompt_metrics([3.0, 0.0, 0.0])
    assert m3["mean@3"] == 1.0 and m3["std@3"] == pytest.approx(math.sqrt((4 + 1 + 1) / 3))
    assert {k for k in m3 if "@" in k} == {"mean@3", "std@3", "best@2/mean", "best@2/std", "worst@2/mean",
                                           "worst@2/std", "best@3/mean", "best@3/std", "worst@3/mean", "worst@3/std"}


def test_equal_answers_make_every_bootstrap_statistic_exact() -> None:
    m = prompt_metrics([1.0, 1.0, 1.0, 1.0], ["7", "7", "7", "7"])
    for k in (2, 4):
        assert m[f"best@{k}/mean"] == m[f"worst@{k}/mean"] == m[f"maj@{k}/mean"] == 1.0
        assert m[f"best@{k}/std"] == m[f"worst@{k}/std"] == m[f"maj@{k}/std"] == 0.0


def test_the_draws_are_verls_legacy_numpy_stream_seeded_42() -> None:
    """verl reseeds the global legacy generator with 42 and draws `choice(n, size=k, replace=True)` 1000 times."""
    np.random.seed(42)
    expected = np.stack([np.random.choice(5, size=4, replace=True) for _ in range(1000)])
    assert (bootstrap_indices(5, 4) == expected).all()
    # best@k over those draws: the share of draws holding the one correct answer (index 2)
    m = prompt_metrics([0.0, 0.0, 1.0, 0.0, 0.0])
    hit = (expected == 2).any(axis=1)
    assert m["best@4/mean"] == pytest.approx(hit.mean())
    assert m["best@4/std"] == pytest.approx(hit.std())
    assert m["worst@4/mean"] == pytest.approx((expected == 2).all(axis=1).mean())  # a draw of only the right one
    # and close to its expectation 1 − (4/5)^4 (1000 draws: within 4 standard errors)
    p = 1 - 0.8 ** 4
    assert abs(m["best@4/mean"] - p) < 4 * math.sqrt(p * (1 - p) / 1000)


def test_majority_vote_takes_the_first_answer_of_the_most_frequent_pred_ties_to_the_first_seen() -> None:
    assert majority_value([0.0, 1.0, 0.5], ["a", "b", "b"]) == 1.0  # b wins 2:1, its first answer's value
    assert majority_value([0.3, 1.0], ["a", "b"]) == 0.3  # 1:1, a seen first
    assert majority_value([0.2, 1.0, 0.9, 0.0], ["x", "y", "y", "x"]) == 0.2  # 2:2, x seen first


def test_maj_at_k_by_hand_over_the_draws() -> None:
    """Three answers: two say "5" (right, value 1), one says "6" (wrong, 0). maj over a draw is 1 unless
    the draw's majority is "6" — or a tie won by "6" seen first (k = 2: draw (2, j) with j ≠ 2)."""
    values, preds = [1.0, 1.0, 0.0], ["5", "5", "6"]
    m = prompt_metrics(values, preds)
    idx = bootstrap_indices(3, 2)
    by_hand = [0.0 if row[0] == 2 else 1.0 for row in idx.tolist()]  # tie or majority: the first answer decides
    assert m["maj@2/mean"] == pytest.approx(np.mean(by_hand))
    assert m["maj@2/std"] == pytest.approx(np.std(by_hand))
    idx3 = bootstrap_indices(3, 3)
    by_hand3 = [0.0 if sum(1 for i in row if i == 2) >= 2 else 1.0 for row in idx3.tolist()]
    assert m["maj@3/mean"] == pytest.approx(np.mean(by_hand3))


def test_sections_follow_verl_core_is_mean_best_maj_of_acc_at_n() -> None:
    answers = [Answer("p0", "src", {"acc": a, "reward": r}, pred)
               for a, r, pred in ((1.0, 1.0, "3"), (0.0, -1.0, "4"), (1.0, 1.0, "3"), (0.0, -1.0, "9"))]
    rec = validation_metrics(answers)
    core = sorted(k for k in rec if k.startswith("val-core/"))
    assert core == ["val-core/src/acc/best@4/mean", "val-core/src/acc/best@4/std", "val-core/src/acc/maj@4/mean",
                    "val-core/src/acc/maj@4/std", "val-core/src/acc/mean@4"]
    assert rec["val-core/src/acc/mean@4"] == 0.5
    assert {"val-aux/src/acc/std@4", "val-aux/src/acc/worst@4/mean", "val-aux/src/acc/best@2/mean",
            "val-aux/src/acc/maj@2/mean", "val-aux/src/reward/mean@4", "val-aux/src/reward/maj@4/mean"} <= set(rec)
    assert rec["val-aux/src/reward/mean@4"] == 0.0


def test_metrics_are_averaged_over_the_prompts_of_a_source_and_a_reward_without_acc_is_core() -> None:
    answers = [Answer("a", "s", {"reward": 1.0}), Answer("a", "s", {"reward": 1.0}),
               Answer("b", "s", {"reward": 0.0}), Answer("b", "s", {"reward": 1.0}),
               Answer("c", "t", {"reward": 0.25})]
    rec = validation_metrics(answers)
    assert rec["val-core/s/reward/mean@2"] == pytest.approx((1.0 + 0.5) / 2)
    assert rec["val-aux/s/reward/std@2"] == pytest.approx((0.0 + 0.5) / 2)
    assert rec["val-core/t/reward/mean@1"] == 0.25
    assert not any("maj@" in k for k in rec)  # no pred: no majority voting
