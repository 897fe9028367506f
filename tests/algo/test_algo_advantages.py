"""GRPO advantages and KL / entropy helpers against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from engine.algo.advantages import broadcast_advantages, grpo_advantages
from engine.algo.kl import entropy_from_logits, kl_penalty


def test_group_normalised_with_unbiased_std() -> None:
    # group [1, 0, 0, 1]: mean 0.5, unbiased std = sqrt(4 · 0.25 / 3) = sqrt(1/3) = 0.57735
    # A = ±0.5 / 0.57735 = ±0.866025
    adv = grpo_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), [7, 7, 7, 7], eps=0.0)
    assert adv.tolist() == pytest.approx([0.866025, -0.866025, -0.866025, 0.866025], abs=1e-6)


def test_without_std_normalisation_only_centres() -> None:
    adv = grpo_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0], [3.0, 1.0, 2.0, 2.0]]), norm_by_std=False)
    assert adv.tolist() == [[0.5, -0.5, -0.5, 0.5], [1.0, -1.0, 0.0, 0.0]]


def test_interleaved_groups_equal_row_layout_and_special_groups() -> None:
    rows = torch.tensor([[1.0, 0.0, 0.0], [0.5, 0.5, 0.5]])
    by_rows = grpo_advantages(rows)
    flat = grpo_advantages(torch.tensor([1.0, 0.5, 0.0, 0.5, 0.0, 0.5]), ["a", "b", "a", "b", "a", "b"])
    assert flat[[0, 2, 4]].tolist() == pytest.approx(by_rows[0].tolist())
    assert by_rows[1].tolist() == [0.0, 0.0, 0.0]  # all-equal rewards carry no signal
    # group [1, 0, 0]: mean 1/3, std = sqrt(((2/3)² + 2 (1/3)²) / 2) = sqrt(1/3); A0 = (2/3)/0.57735 = 1.154700
    assert by_rows[0, 0].item() == pytest.approx(1.154700, abs=1e-5)
    # a singleton group uses mean 0 and std 1 (verl): A = r / (1 + eps)
    single = grpo_advantages(torch.tensor([0.8]), [0])
    assert single.item() == pytest.approx(0.8 / (1 + 1e-6))


def test_broadcast_and_errors() -> None:
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert broadcast_advantages(torch.tensor([2.0, -1.0]), mask).tolist() == [[2.0, 2.0, 0.0], [-1.0, 0.0, 0.0]]
    with pytest.raises(ValueError, match="group_ids"):
        grpo_advantages(torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="entries"):
        grpo_advantages(torch.tensor([1.0, 2.0]), [0])
    with pytest.raises(ValueError):
        broadcast_advantages(torch.tensor([1.0]), mask)


def test_kl_estimators_by_hand() -> None:
    # log π = log 0.5, log π_ref = log 0.25: Δ = log 2 = 0.693147
    logp, ref = torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)])
    assert kl_penalty(logp, ref, "k1").item() == pytest.approx(0.693147, abs=1e-6)
    assert kl_penalty(logp, ref, "abs").item() == pytest.approx(0.693147, abs=1e-6)
    assert kl_penalty(logp, ref, "k2").item() == pytest.approx(0.5 * 0.693147**2, abs=1e-6)  # 0.240227
    # k3: ratio π_ref/π = 0.5, 0.5 − log 0.5 − 1 = 0.193147
    assert kl_penalty(logp, ref, "low_var_kl").item() == pytest.approx(0.193147, abs=1e-6)
    assert kl_penalty(logp, ref, "mse").item() == kl_penalty(logp, ref, "k2").item()
    # k3 is clamped to 10 when π_ref ≫ π (Δ = −30 → exp(20) − 21 ≫ 10)
    assert kl_penalty(torch.tensor([-30.0]), torch.tensor([0.0]), "k3").item() == 10.0
    with pytest.raises(ValueError, match="unknown KL"):
        kl_penalty(logp, ref, "k4")


def test_entropy_from_logits() -> None:
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [100.0, 0.0, 0.0, 0.0]])
    ent = entropy_from_logits(logits)
    assert ent[0].item() == pytest.approx(math.log(4))  # uniform over 4
    assert ent[1].item() == pytest.approx(0.0, abs=1e-6)  # (almost) deterministic
    # p = softmax([log 0.5, log 0.25, log 0.25]) → H = 0.5 log 2 + 2 · 0.25 log 4 = 1.5 log 2
    assert entropy_from_logits(torch.log(torch.tensor([0.5, 0.25, 0.25]))).item() == pytest.approx(1.5 * math.log(2))


def test_a_group_of_equal_fractional_rewards_has_exactly_zero_advantage() -> None:
    # 8 × 0.1 (a format bonus every answer earns): the fp32 mean is not exactly 0.1, and without the equal-group
    # rule the residue / (std + eps) gave |A| ≈ 7e-3 — such a group escaped zero_adv_fraction / skip_zero_advantage.
    rewards = torch.tensor([0.1] * 8 + [0.3, 0.1, 0.1, 0.1], dtype=torch.float32)
    adv = grpo_advantages(rewards, [0] * 8 + [1] * 4)
    assert adv[:8].eq(0).all()
    assert adv[8].item() > 1.0 and (adv[9:] < 0).all()
