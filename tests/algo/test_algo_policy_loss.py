"""Loss aggregation modes, PPO-clip (asymmetric + dual-clip) and REINFORCE against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from engine.algo.policy_loss import agg_loss, ppo_clip_loss, reinforce_loss

LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])  # third row empty


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", 7.0 / 3.0),  # (1 + 2 + 4) / 3 tokens
        ("seq-mean-token-sum", 3.5),  # ((1 + 2) + 4) / 2 non-empty rows
        ("seq-mean-token-mean", 2.75),  # (1.5 + 4) / 2 non-empty rows
    ],
)
def test_agg_modes(mode: str, expected: float) -> None:
    assert agg_loss(LOSS, MASK, mode).item() == pytest.approx(expected)


def test_agg_explicit_denominator_and_empty_mask() -> None:
    assert agg_loss(LOSS, MASK, "token-mean", denominator=7.0).item() == pytest.approx(1.0)
    x = LOSS.clone().requires_grad_(True)
    zero = agg_loss(x, torch.zeros(3, 3), "seq-mean-token-mean")
    zero.backward()
    assert zero.item() == 0.0 and x.grad is not None and not x.grad.any()
    # NaN/inf at masked-out positions never leak into the loss
    garbage = LOSS.clone()
    garbage[0, 2], garbage[2, 0] = float("nan"), float("inf")
    assert agg_loss(garbage, MASK, "token-mean").item() == pytest.approx(7.0 / 3.0)
    with pytest.raises(ValueError, match="loss_agg_mode"):
        agg_loss(LOSS, MASK, "token-sum-norm")


def _ppo(ratios: list[float], adv: list[float], **kw):
    old = torch.zeros(1, len(ratios))
    logp = torch.log(torch.tensor([ratios])).requires_grad_(True)
    out = ppo_clip_loss(logp, old, torch.tensor([adv]), torch.ones(1, len(ratios)), **kw)
    return out, logp


def test_ppo_clip_cases_by_hand() -> None:
    # ε_low = 0.2, ε_high = 0.28, c = 3, token-mean over 4 tokens:
    #  r=1.5, A=+1: ℓ¹=−1.5, ℓ²=−1.28 → max −1.28 (clipped, zero grad)
    #  r=0.5, A=+1: ℓ¹=−0.5, ℓ²=−0.8  → −0.5     (unclipped, dℓ/dlogr = −A·r = −0.5)
    #  r=0.5, A=−1: ℓ¹=0.5,  ℓ²=0.8   → 0.8      (clipped, zero grad)
    #  r=5.0, A=−1: ℓ¹=5,    ℓ²=1.28  → 5, dual-clip min(5, 3) = 3 (clipped by c, zero grad)
    out, logp = _ppo([1.5, 0.5, 0.5, 5.0], [1.0, 1.0, -1.0, -1.0], clip_ratio_low=0.2, clip_ratio_high=0.28)
    assert out.pg_loss.item() == pytest.approx((-1.28 - 0.5 + 0.8 + 3.0) / 4)
    assert out.pg_clipfrac == pytest.approx(2 / 4)  # ℓ² > ℓ¹ for tokens 1 and 3
    assert out.pg_clipfrac_lower == pytest.approx(1 / 4)  # token 4 hit the dual clip
    # ppo_kl = mean(log π_old − log π_θ) = −(log 1.5 + 2 log 0.5 + log 5)/4
    assert out.ppo_kl == pytest.approx(-(math.log(1.5) + 2 * math.log(0.5) + math.log(5.0)) / 4, rel=1e-5)
    out.pg_loss.backward()
    assert logp.grad.tolist()[0] == pytest.approx([0.0, -0.5 / 4, 0.0, 0.0], abs=1e-6)


def test_dual_clip_inactive_below_c_and_validation() -> None:
    # r=2.5 < c=3 with A=−1: ℓ¹ = 2.5 wins over ℓ² = 1.2 and stays below −A·c = 3
    out, _ = _ppo([2.5], [-1.0])
    assert out.pg_loss.item() == pytest.approx(2.5) and out.pg_clipfrac_lower == 0.0
    with pytest.raises(ValueError, match="clip_ratio_c"):
        _ppo([1.0], [1.0], clip_ratio_c=1.0)


def test_is_weights_scale_each_token_before_aggregation() -> None:
    # r = 1 everywhere: ℓ = −A; weights [2, 0.5] → (−2·1 − 0.5·(−2)) / 2 = −0.5
    logp = torch.zeros(1, 2)
    out = ppo_clip_loss(logp, logp, torch.tensor([[1.0, -2.0]]), torch.ones(1, 2), is_weights=torch.tensor([[2.0, 0.5]]))
    assert out.pg_loss.item() == pytest.approx(-0.5)


def test_reinforce_by_hand() -> None:
    # L = mean(−A · log π · w): tokens (A=1, log π=−1, w=2) and (A=−1, log π=−2, w=1) → (2 − 2)/2 = 0 ; grad −A·w/2
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    rollout = torch.tensor([[-1.5, -1.0]])
    out = reinforce_loss(logp, rollout, torch.tensor([[1.0, -1.0]]), torch.ones(1, 2), is_weights=torch.tensor([[2.0, 1.0]]))
    assert out.pg_loss.item() == pytest.approx(0.0)
    out.pg_loss.backward()
    assert logp.grad.tolist() == [[-1.0, 0.5]]
    assert out.ppo_kl == pytest.approx(((-1.5 + 1.0) + (-1.0 + 2.0)) / 2)  # mean(log π_rollout − log π_θ)
    assert "actor/pg_clipfrac" not in out.metrics()
