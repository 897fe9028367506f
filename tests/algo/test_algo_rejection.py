"""Rejection sampling options, thresholds, chaining, the k1 orientation and legacy names — by hand.

Same fixture as test_algo_rollout_correction: ratio π_train/π_rollout = [[2, 1.5, ·], [1, 0.5, 4]].
Per-token statistics (Δ = log ratio):
    k1 = −Δ       = [[−0.693147, −0.405465], [0, 0.693147, −1.386294]]   (log π_rollout/π_train)
    k2 = ½Δ²      = [[0.240227, 0.082204], [0, 0.240227, 0.960906]]
    k3 = e^Δ−1−Δ  = [[0.306853, 0.094535], [0, 0.193147, 1.613706]]
Per row:         sum k1      mean k1     sum k2    mean k2   max k2    sum k3    mean k3   max k3
    row 0      −1.098612   −0.549306   0.322431  0.161216  0.240227  0.401388  0.200694  0.306853
    row 1      −0.693147   −0.231049   1.201133  0.400378  0.960906  1.806853  0.602284  1.613706
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from engine.config.rc_config import parse_rs_thresholds, validate_rc_config
from engine.algo.rollout_correction import compute_rollout_correction

LN = math.log
ROLLOUT = torch.full((2, 3), -1.0)
OLD = ROLLOUT + torch.tensor([[LN(2), LN(1.5), 0.0], [0.0, LN(0.5), LN(4)]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
P = "rollout_corr/"
KEEP0 = [[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]  # keep row 0 only


def rs(option: str, threshold):
    return compute_rollout_correction(OLD, ROLLOUT, MASK, rollout_rs=option, rollout_rs_threshold=threshold)


@pytest.mark.parametrize(
    ("option", "threshold", "expected"),
    [
        # token_k1 keeps 0.4 ≤ π_rollout/π_train ≤ 1.8: ratios rollout/train = [[0.5, 0.667], [1, 2, 0.25]]
        ("token_k1", "0.4_1.8", [[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]]),
        ("token_k2", 0.1, [[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]),
        ("token_k3", 0.2, [[0.0, 1.0, 0.0], [1.0, 1.0, 0.0]]),
        # seq_sum_k1 keeps 0.4 ≤ Π π_rollout/π_train ≤ 2.5: row 0 has 1/3 (out), row 1 has 1/2 (in)
        ("seq_sum_k1", "0.4_2.5", [[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]]),
        ("seq_sum_k2", 0.5, KEEP0),
        ("seq_sum_k3", 1.0, KEEP0),
        ("seq_mean_k2", 0.3, KEEP0),
        ("seq_mean_k3", 0.15, [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]),
        ("seq_max_k2", 0.5, KEEP0),
        ("seq_max_k3", 0.5, KEEP0),
        # seq_mean_k1: geo-mean of π_rollout/π_train = 3^−½ = 0.577 (row 0), 2^−⅓ = 0.794 (row 1)
        ("seq_mean_k1", "0.7_1.0", [[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]]),
    ],
)
def test_each_option_by_hand(option: str, threshold, expected) -> None:
    _, mask, m = rs(option, threshold)
    assert mask.tolist() == expected
    removed = MASK.sum().item() - sum(map(sum, expected))
    assert m[P + f"rollout_rs_{option}_masked_fraction"] == pytest.approx(removed / 5)
    assert m[P + "rollout_rs_masked_fraction"] == pytest.approx(removed / 5)


def test_option_statistics_metrics() -> None:
    _, _, m = rs("seq_mean_k3", 0.25)
    # row values 0.200694 and 0.602284; only row 1 exceeds 0.25
    assert m[P + "rollout_rs_seq_mean_k3_max"] == pytest.approx(0.602284, rel=1e-5)
    assert m[P + "rollout_rs_seq_mean_k3_min"] == pytest.approx(0.200694, rel=1e-5)
    assert m[P + "rollout_rs_seq_mean_k3_fraction_high"] == pytest.approx(0.5)
    assert m[P + "rollout_rs_seq_mean_k3_fraction_low"] == 0.0  # lower bound only for k1
    assert m[P + "rollout_rs_seq_mean_k3_seq_masked_fraction"] == pytest.approx(0.5)
    # token-weighted mean of the broadcast statistic: (2·0.200694 + 3·0.602284)/5
    assert m[P + "rollout_rs_seq_mean_k3_mean"] == pytest.approx((2 * 0.200694 + 3 * 0.602284) / 5, rel=1e-5)
    assert P + "rollout_rs_seq_mean_k3_seq_fraction_low" not in m
    _, _, m = rs("token_k1", "0.4_1.8")
    # token option: max/min over tokens of k1; fractions in log space (k1 < log 0.4 → the 0.25 ratio)
    assert m[P + "rollout_rs_token_k1_max"] == pytest.approx(LN(2), rel=1e-5)
    assert m[P + "rollout_rs_token_k1_min"] == pytest.approx(-LN(4), rel=1e-5)
    assert m[P + "rollout_rs_token_k1_fraction_low"] == pytest.approx(1 / 5)
    assert m[P + "rollout_rs_token_k1_fraction_high"] == pytest.approx(1 / 5)
    assert P + "rollout_rs_token_k1_seq_fraction_low" in m


def test_chained_options_are_anded_and_deduplicated() -> None:
    # token_k3 ≤ 0.2 keeps [[0,1],[1,1,0]]; seq_sum_k1 0.4_2.5 rejects row 0 → [[0,0,0],[1,1,0]]
    _, mask, m = rs("token_k3, seq_sum_k1,token_k3", "0.2,0.4_2.5")
    assert mask.tolist() == [[0.0, 0.0, 0.0], [1.0, 1.0, 0.0]]
    assert m[P + "rollout_rs_masked_fraction"] == pytest.approx(3 / 5)
    assert m[P + "rollout_rs_seq_masked_fraction"] == pytest.approx(1.0)
    assert m[P + "rollout_rs_token_k3_masked_fraction"] == pytest.approx(2 / 5)
    assert m[P + "rollout_rs_seq_sum_k1_seq_masked_fraction"] == pytest.approx(1 / 2)
    # one spec is broadcast to every option
    _, mask_b, _ = rs("seq_mean_k2,seq_max_k2", 0.3)
    assert mask_b.tolist() == KEEP0


def test_k1_orientation_is_rollout_over_train() -> None:
    # rows with constant per-token ratio π_train/π_rollout: 0.8 (geo 0.8) and 1.2 (geo 1.2)
    rollout = torch.full((2, 4), -2.0)
    old = rollout + torch.tensor([[LN(0.8)] * 4, [LN(1.2)] * 4])
    _, mask, _ = compute_rollout_correction(
        old, rollout, torch.ones(2, 4), rollout_rs="seq_mean_k1", rollout_rs_threshold="0.9_1.6"
    )
    # verl bounds π_rollout/π_train: 1/0.8 = 1.25 ∈ [0.9, 1.6] kept; 1/1.2 = 0.833 ∉ → rejected.
    # (A naive π_train/π_rollout reading would do the opposite.)
    assert mask.tolist() == [[1.0] * 4, [0.0] * 4]


def test_float_k1_threshold_means_reciprocal_band() -> None:
    assert rs("token_k1", 1.8)[1].tolist() == rs("token_k1", f"{1 / 1.8}_1.8")[1].tolist()
    th = parse_rs_thresholds(["seq_mean_k1", "seq_max_k3"], 2.0)
    assert (th[0].lower, th[0].upper, th[1].lower, th[1].upper) == (0.5, 2.0, None, 2.0)


@pytest.mark.parametrize(
    ("options", "threshold", "error", "match"),
    [
        ("geometric", "0.9_1.1", ValueError, "seq_mean_k1"),
        ("sequence", 2.0, ValueError, "seq_sum_k1"),
        ("token", 2.0, ValueError, "token_k1"),
        ("seq_max_k1", 2.0, ValueError, "unknown rollout_rs option"),
        ("seq_mean_k3", "0.1_0.2", ValueError, "upper bound only"),
        ("seq_mean_k1", None, ValueError, "must be set"),
        ("seq_mean_k1,token_k2", "1.1,2.0,3.0", ValueError, "one per option"),
        ("token_k1", "2.0_0.5", ValueError, "0 < lower < upper"),
        ("token_k2", "-1", ValueError, "must be > 0"),
        ("token_k2", True, TypeError, "boolean"),
        (" , ", 2.0, ValueError, "empty"),
    ],
)
def test_bad_specs_raise_clear_errors(options, threshold, error, match) -> None:
    with pytest.raises(error, match=match):
        rs(options, threshold)


def test_validate_rc_config() -> None:
    ok = SimpleNamespace(rollout_is="sequence", rollout_is_threshold=2.0, rollout_rs="seq_mean_k1",
                         rollout_rs_threshold="0.999_1.001", bypass_mode=False, loss_type="ppo_clip")
    assert validate_rc_config(ok) == []
    warn = validate_rc_config(SimpleNamespace(**{**vars(ok), "bypass_mode": True}))
    assert len(warn) == 1 and "metrics only" in warn[0]
    assert validate_rc_config(SimpleNamespace(**{**vars(ok), "bypass_mode": True, "loss_type": "reinforce"})) == []
    with pytest.raises(ValueError, match="seq_mean_k1"):
        validate_rc_config(SimpleNamespace(**{**vars(ok), "rollout_rs": "geometric"}))
    with pytest.raises(ValueError, match="loss_type"):
        validate_rc_config(SimpleNamespace(**{**vars(ok), "loss_type": "ppo"}))
    with pytest.raises(ValueError, match="0 < lower < upper"):
        validate_rc_config(SimpleNamespace(**{**vars(ok), "rollout_is_threshold": "3_2"}))
