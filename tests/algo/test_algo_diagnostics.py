"""IS-weight / staleness histograms and the train–inference mismatch alarm."""

from __future__ import annotations

import math

import pytest
import torch

from engine.algo.rc_diagnostics import is_weight_histogram, mismatch_alarm, staleness_histogram


def test_is_histogram_log_bins_with_overflow_into_end_bins() -> None:
    w = torch.tensor([[0.0, 2.0, 2.0, 20.0], [1e5, 0.003, 7.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0]])  # 7 and 9 are padding
    h = is_weight_histogram(w, mask, bins=6, low=1e-3, high=1e3)
    assert h["edges"] == pytest.approx([1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0, 1e3])
    # 0 → first bin (below low), 0.003 → [1e-3, 1e-2), 2, 2 → [1, 10), 20 → [10, 100), 1e5 → last bin
    assert h["counts"] == [2.0, 0.0, 0.0, 2.0, 1.0, 1.0]
    assert sum(h["counts"]) == mask.sum().item()
    with pytest.raises(ValueError):
        is_weight_histogram(w, mask, bins=0)


def test_staleness_histogram() -> None:
    assert staleness_histogram([0, 2, 0]) == {"edges": [0.0, 1.0, 2.0, 3.0], "counts": [2.0, 0.0, 1.0]}
    assert staleness_histogram([]) == {"edges": [0.0, 1.0], "counts": [0.0]}
    with pytest.raises(ValueError):
        staleness_histogram([-1])


def test_mismatch_alarm_bounds() -> None:
    healthy = {"rollout_corr/kl": -0.01, "rollout_corr/ppl_ratio": 1.05, "rollout_corr/chi2_token": 0.2}
    assert mismatch_alarm(healthy, kl_bound=0.05, ppl_ratio_bound=1.2, chi2_bound=1.0) == []
    bad = {"rollout_corr/kl": -0.1, "rollout_corr/ppl_ratio": 0.8, "rollout_corr/chi2_token": 2.0}
    alarms = mismatch_alarm(bad, kl_bound=0.05, ppl_ratio_bound=1.2, chi2_bound=1.0)
    assert len(alarms) == 3
    assert "|kl| = 0.1" in alarms[0] and "ppl_ratio = 0.8" in alarms[1] and "chi2_token = 2" in alarms[2]
    # bare names, NaN always alarms, missing metrics are skipped
    assert len(mismatch_alarm({"kl": math.nan}, 0.05, 1.2, 1.0)) == 1
    assert mismatch_alarm({"ppl_ratio": 1 / 1.1}, 0.05, 1.2, 1.0) == []
    assert len(mismatch_alarm({"ppl_ratio": 1.3}, 0.05, 1.2, 1.0)) == 1
