"""Property tests (hypothesis) of the rollout-correction invariants."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.config.rc_config import RS_OPTIONS
from engine.algo.rollout_correction import compute_rollout_correction

torch.set_num_threads(1)


@st.composite
def batches(draw) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    b = draw(st.integers(1, 5))
    r = draw(st.integers(1, 7))
    vals = st.floats(-4.0, 0.0, allow_nan=False, width=32)
    old = torch.tensor(draw(st.lists(st.lists(vals, min_size=r, max_size=r), min_size=b, max_size=b)))
    rollout = torch.tensor(draw(st.lists(st.lists(vals, min_size=r, max_size=r), min_size=b, max_size=b)))
    lengths = draw(st.lists(st.integers(0, r), min_size=b, max_size=b))
    if max(lengths) == 0:
        lengths[0] = 1
    mask = (torch.arange(r)[None, :] < torch.tensor(lengths)[:, None]).float()
    return old, rollout, mask


THRESHOLDS = st.sampled_from([1.01, 1.2, 2.0, 5.0])


@settings(max_examples=60, deadline=None)
@given(batches(), st.sampled_from(["token", "sequence"]), THRESHOLDS)
def test_tis_weights_never_exceed_c(data, level: str, c: float) -> None:
    old, rollout, mask = data
    w, _, _ = compute_rollout_correction(old, rollout, mask, rollout_is=level, rollout_is_threshold=c)
    assert w.max() <= torch.tensor(c, dtype=w.dtype)  # C as represented in the weights' dtype
    assert (w[mask == 0] == 0).all() and (w >= 0).all()


@settings(max_examples=60, deadline=None)
@given(batches(), THRESHOLDS)
def test_sequence_weights_are_constant_along_a_row(data, c: float) -> None:
    old, rollout, mask = data
    w, _, _ = compute_rollout_correction(old, rollout, mask, rollout_is="sequence", rollout_is_threshold=c)
    for row, m in zip(w, mask):
        vals = row[m.bool()]
        if vals.numel():
            assert torch.all(vals == vals[0])


@settings(max_examples=60, deadline=None)
@given(batches(), st.sampled_from(["token_k1", "seq_sum_k1", "seq_mean_k1"]), THRESHOLDS)
def test_reciprocal_k1_bounds_give_the_same_mask_in_both_orientations(data, option: str, u: float) -> None:
    old, rollout, mask = data
    spec = f"{1.0 / u}_{u}"
    _, forward, _ = compute_rollout_correction(old, rollout, mask, rollout_rs=option, rollout_rs_threshold=spec)
    _, swapped, _ = compute_rollout_correction(rollout, old, mask, rollout_rs=option, rollout_rs_threshold=spec)
    assert torch.equal(forward, swapped)


def _option_with_threshold(option: str) -> st.SearchStrategy[tuple[str, str]]:
    if option.endswith("k1"):
        specs = st.sampled_from(["1.05", "2.0", "0.5_1.01", "0.99_3.0"])
    else:
        specs = st.sampled_from(["0.01", "0.5", "2.0"])
    return specs.map(lambda spec: (option, spec))


@settings(max_examples=80, deadline=None)
@given(batches(), st.lists(st.sampled_from(RS_OPTIONS).flatmap(_option_with_threshold), min_size=1, max_size=3,
                           unique_by=lambda p: p[0]))
def test_masks_only_ever_remove_tokens(data, chain: list[tuple[str, str]]) -> None:
    old, rollout, mask = data
    options, specs = ",".join(o for o, _ in chain), ",".join(t for _, t in chain)
    _, new, m = compute_rollout_correction(old, rollout, mask, rollout_rs=options, rollout_rs_threshold=specs)
    assert torch.all(new <= mask) and set(new.unique().tolist()) <= {0.0, 1.0}
    assert 0.0 <= m["rollout_corr/rollout_rs_masked_fraction"] <= 1.0
