"""compute_rollout_correction: IS weights, TIS, IcePop, batch normalisation, diagnostics — by hand.

Fixture (π_train/π_rollout per token, Δ = log of it; third position of row 0 is padding):

    ratio = [[2, 1.5, ·], [1, 0.5, 4]]      mask = [[1, 1, 0], [1, 1, 1]]
    sequence products: row 0 = 3, row 1 = 2
"""

from __future__ import annotations

import math

import pytest
import torch

from engine.algo.rollout_correction import compute_rollout_correction

LN = math.log
ROLLOUT = torch.full((2, 3), -1.0)
DELTA = torch.tensor([[LN(2), LN(1.5), 0.0], [0.0, LN(0.5), LN(4)]])
OLD = ROLLOUT + DELTA
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
P = "rollout_corr/"


def rc(**kw):
    return compute_rollout_correction(OLD, ROLLOUT, MASK, **kw)


def test_token_tis_weights_and_metrics() -> None:
    w, mask, m = rc(rollout_is="token", rollout_is_threshold=2.0)
    # raw [[2, 1.5, 0], [1, 0.5, 4]] → min(·, 2)
    torch.testing.assert_close(w, torch.tensor([[2.0, 1.5, 0.0], [1.0, 0.5, 2.0]]))
    assert torch.equal(mask, MASK) and not w.requires_grad
    assert m[P + "rollout_is_mean"] == pytest.approx(7.0 / 5.0)  # (2 + 1.5 + 1 + 0.5 + 2) / 5
    assert m[P + "rollout_is_ratio_fraction_high"] == pytest.approx(1 / 5)  # raw 4 > 2
    assert m[P + "rollout_is_ratio_fraction_low"] == 0.0  # nothing < 1/C = 0.5
    assert (m[P + "rollout_is_max"], m[P + "rollout_is_min"]) == pytest.approx((2.0, 0.5))
    # E[w²] = (4 + 2.25 + 1 + 0.25 + 4)/5 = 2.3; std = sqrt(2.3 − 1.96) ; ESS = 1.96 / 2.3
    assert m[P + "rollout_is_std"] == pytest.approx(math.sqrt(0.34), rel=1e-5)
    assert m[P + "rollout_is_eff_sample_size"] == pytest.approx(1.96 / 2.3, rel=1e-5)
    # row means 1.75 and 3.5/3; raw row means 1.75 and 5.5/3 (none beyond 2 or below 0.5)
    assert m[P + "rollout_is_seq_mean"] == pytest.approx((1.75 + 3.5 / 3) / 2, rel=1e-5)
    assert m[P + "rollout_is_seq_std"] == pytest.approx((1.75 - 3.5 / 3) / math.sqrt(2), rel=1e-5)
    assert m[P + "rollout_is_seq_max_deviation"] == pytest.approx(0.75, rel=1e-5)
    assert m[P + "rollout_is_seq_fraction_high"] == 0.0


def test_sequence_tis_uses_product_and_broadcasts() -> None:
    w, _, m = rc(rollout_is="sequence", rollout_is_threshold=2.5)
    # row products 3 → clamp 2.5, and 2
    torch.testing.assert_close(w, torch.tensor([[2.5, 2.5, 0.0], [2.0, 2.0, 2.0]]))
    assert (m[P + "rollout_is_max"], m[P + "rollout_is_min"]) == pytest.approx((3.0, 2.0), rel=1e-5)  # unclamped
    assert m[P + "rollout_is_mean"] == pytest.approx(11.0 / 5.0)
    assert m[P + "rollout_is_ratio_fraction_high"] == pytest.approx(0.5)  # row 0: 3 > 2.5


def test_icepop_zeroes_raw_weights_outside_band_and_keeps_mask() -> None:
    w, mask, m = rc(rollout_is="token", rollout_is_threshold="0.6_2.5")
    # raw 0.5 < 0.6 and 4 > 2.5 are zeroed; 2 and 1.5 kept unclamped
    torch.testing.assert_close(w, torch.tensor([[2.0, 1.5, 0.0], [1.0, 0.0, 0.0]]))
    assert torch.equal(mask, MASK)
    assert m[P + "rollout_is_oob_ratio"] == pytest.approx(2 / 5)
    assert m[P + "rollout_is_ratio_fraction_low"] == pytest.approx(1 / 5)  # lower bound is IcePop's 0.6


def test_batch_normalisation_token_vs_sequence() -> None:
    w, _, m = rc(rollout_is="token", rollout_is_threshold=2.0, rollout_is_batch_normalize=True)
    assert m[P + "rollout_is_batch_norm_factor"] == pytest.approx(1.4)  # token mean of the TIS weights
    torch.testing.assert_close(w, torch.tensor([[2.0, 1.5, 0.0], [1.0, 0.5, 2.0]]) / 1.4)
    w, _, m = rc(rollout_is="sequence", rollout_is_threshold=2.5, rollout_is_batch_normalize=True)
    # sequence level averages one weight per row: (2.5 + 2)/2 = 2.25 (a token mean would give 2.2)
    assert m[P + "rollout_is_batch_norm_factor"] == pytest.approx(2.25)
    torch.testing.assert_close(w, torch.tensor([[2.5, 2.5, 0.0], [2.0, 2.0, 2.0]]) / 2.25)
    # all-zero weights (IcePop rejects everything): normalisation skipped, factor 1, ESS 0
    w, _, m = rc(rollout_is="token", rollout_is_threshold="5_6", rollout_is_batch_normalize=True)
    assert not w.any() and m[P + "rollout_is_batch_norm_factor"] == 1.0
    assert m[P + "rollout_is_eff_sample_size"] == 0.0


def test_offpolicy_diagnostics_by_hand() -> None:
    _, _, m = rc()
    assert not any(k.startswith((P + "rollout_is", P + "rollout_rs")) for k in m)
    # kl = mean(log π_rollout − log π_train) = −(log 2 + log 1.5 + 0 + log 0.5 + log 4)/5 = −log 6 / 5
    assert m[P + "kl"] == pytest.approx(-LN(6) / 5, rel=1e-5)
    # k3 per token: ρ − 1 − log ρ = 0.306853, 0.094535, 0, 0.193147, 1.613706
    assert m[P + "k3_kl"] == pytest.approx((0.306853 + 0.094535 + 0.193147 + 1.613706) / 5, rel=1e-5)
    # row means of log π_train: −1 + log 3 / 2 and −1 + log 2 / 3; of log π_rollout: −1
    t0, t1 = 1 - LN(3) / 2, 1 - LN(2) / 3
    assert m[P + "training_log_ppl"] == pytest.approx((t0 + t1) / 2, rel=1e-5)
    assert m[P + "training_ppl"] == pytest.approx((math.exp(t0) + math.exp(t1)) / 2, rel=1e-5)
    assert (m[P + "rollout_ppl"], m[P + "rollout_log_ppl"]) == pytest.approx((math.e, 1.0), rel=1e-5)
    d0, d1 = -LN(3) / 2, -LN(2) / 3  # log_ppl_diff per row = rollout row mean − train row mean
    assert m[P + "log_ppl_diff"] == pytest.approx((d0 + d1) / 2, rel=1e-5)
    assert m[P + "log_ppl_abs_diff"] == pytest.approx(-(d0 + d1) / 2, rel=1e-5)
    assert (m[P + "log_ppl_diff_max"], m[P + "log_ppl_diff_min"]) == pytest.approx((d1, d0), rel=1e-5)
    assert m[P + "ppl_ratio"] == pytest.approx((3**-0.5 + 2 ** (-1 / 3)) / 2, rel=1e-5)
    assert m[P + "chi2_token"] == pytest.approx((4 + 2.25 + 1 + 0.25 + 16) / 5 - 1, rel=1e-5)  # 3.7
    assert m[P + "chi2_seq"] == pytest.approx((9 + 4) / 2 - 1, rel=1e-5)  # 5.5


def test_empty_rows_are_ignored_not_averaged_in() -> None:
    old = torch.cat([OLD, torch.zeros(1, 3)])
    rollout = torch.cat([ROLLOUT, torch.zeros(1, 3)])
    mask = torch.cat([MASK, torch.zeros(1, 3)])
    kw = {"rollout_is": "sequence", "rollout_is_threshold": 2.5, "rollout_rs": "seq_mean_k2", "rollout_rs_threshold": 0.3}
    w3, mask3, m3 = compute_rollout_correction(old, rollout, mask, **kw)
    w2, _mask2, m2 = compute_rollout_correction(OLD, ROLLOUT, MASK, **kw)
    assert torch.equal(w3[:2], w2) and not w3[2].any() and not mask3[2].any()
    assert m3 == pytest.approx(m2, rel=1e-5)


def test_robustness_errors_name_the_problem() -> None:
    bad = OLD.clone()
    bad[1, 2] = float("nan")
    with pytest.raises(ValueError, match=r"old_log_prob .* rows \[1\] .*row 1, token 2"):
        rc_args = (bad, ROLLOUT, MASK)
        compute_rollout_correction(*rc_args)
    roll = ROLLOUT.clone()
    roll[0, 0] = float("-inf")
    with pytest.raises(ValueError, match=r"rollout_log_prob .* rows \[0\]"):
        compute_rollout_correction(OLD, roll, MASK)
    padded_garbage = OLD.clone()
    padded_garbage[0, 2] = float("nan")  # padding: ignored
    assert compute_rollout_correction(padded_garbage, ROLLOUT, MASK)[2] == pytest.approx(rc()[2])
    with pytest.raises(ValueError, match="shape"):
        compute_rollout_correction(OLD[:, :2], ROLLOUT, MASK)
    with pytest.raises(ValueError, match="response_mask shape"):
        compute_rollout_correction(OLD, ROLLOUT, MASK[:1])
    with pytest.raises(ValueError, match="at least one valid token"):
        compute_rollout_correction(OLD, ROLLOUT, torch.zeros(2, 3))
    with pytest.raises(ValueError, match="rollout_is_threshold is None"):
        rc(rollout_is="token", rollout_is_threshold=None)
    with pytest.raises(ValueError, match="no geometric IS level"):
        rc(rollout_is="geometric")


def test_low_precision_inputs_are_computed_in_float32() -> None:
    w, mask, m = compute_rollout_correction(OLD.bfloat16(), ROLLOUT.bfloat16(), MASK.bool(), rollout_is="token")
    assert w.dtype == torch.float32 and mask.dtype == torch.bool
    assert m[P + "rollout_is_mean"] == pytest.approx(1.4, rel=1e-2)
