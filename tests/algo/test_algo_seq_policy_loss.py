"""GSPO and GMPO (`trainer.loss_mode = "gspo" / "geo_mean"`): against the papers' formulas recomputed row by row
in plain Python, finite gradients, exact gradient accumulation, and the config rules."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from engine.algo.loss import build_loss_fn, micro_batch_weight, prepare_decoupled
from engine.algo.policy_loss import ppo_clip_loss
from engine.algo.seq_policy_loss import geo_mean_loss, gspo_loss
from engine.config.loss_mode import effective_agg_mode, loss_mode_error
from engine.trainer.base import TrainBatch

torch.set_num_threads(1)
F64 = torch.float64
EPS_LOW, EPS_HIGH = 0.2, 0.28


def case(seed: int, b: int = 6, r: int = 7, spread: float = 0.4):
    g = torch.Generator().manual_seed(seed)
    lp = -torch.rand(b, r, generator=g, dtype=F64) * 3
    old = lp + spread * torch.randn(b, r, generator=g, dtype=F64)
    lengths = torch.randint(1, r + 1, (b,), generator=g)
    lengths[2] = 0  # an empty row
    mask = (torch.arange(r)[None] < lengths[:, None]).double()
    adv = torch.randn(b, 1, generator=g, dtype=F64) * mask  # sequence-level advantages, GRPO style
    w = torch.rand(b, r, generator=g, dtype=F64) * 1.5 + 0.25
    return lp, old, adv, mask, w


def clip(x: float, lo: float, hi: float) -> float:
    return min(max(x, lo), hi)


def gspo_reference(lp, old, adv, mask, w=None) -> float:
    """GSPO, arXiv 2507.18071 eq. (5)-(7): s_i = (π_θ(y_i)/π_old(y_i))^(1/|y_i|); per token
    max(−A·s, −A·clip(s, 1−ε_l, 1+ε_h)) (with s capped at e^10), token-mean in a row, mean over non-empty rows."""
    rows = []
    for i in range(lp.shape[0]):
        toks = [t for t in range(lp.shape[1]) if mask[i, t] > 0]
        if not toks:
            continue
        s = math.exp(min(sum(float(lp[i, t] - old[i, t]) for t in toks) / len(toks), 10.0))
        terms = []
        for t in toks:
            a = float(adv[i, t])
            term = max(-a * s, -a * clip(s, 1 - EPS_LOW, 1 + EPS_HIGH))
            terms.append(term * (float(w[i, t]) if w is not None else 1.0))
        rows.append(sum(terms) / len(terms))
    return sum(rows) / len(rows)


def gmpo_reference(lp, old, adv, mask, w=None) -> float:
    """GMPO, arXiv 2507.20673 eq. (6): −Ā·Π_t clip(r_t)^(1/|y|) with each token ratio clipped in log space on the
    side the advantage's sign selects (A > 0: δ ≤ ε_h, A < 0: δ ≥ −ε_l); IS weights by their geometric mean."""
    rows = []
    for i in range(lp.shape[0]):
        toks = [t for t in range(lp.shape[1]) if mask[i, t] > 0]
        if not toks:
            continue
        logs, advs, logw = [], [], []
        for t in toks:
            d, a = float(lp[i, t] - old[i, t]), float(adv[i, t])
            if a > 0:
                d = min(d, EPS_HIGH)
            elif a < 0:
                d = max(d, -EPS_LOW)
            else:
                d = 0.0
            logs.append(d)
            advs.append(a)
            logw.append(math.log(float(w[i, t])) if w is not None else 0.0)
        n = len(toks)
        rows.append(-(sum(advs) / n) * math.exp(sum(logs) / n) * math.exp(sum(logw) / n))
    return sum(rows) / len(rows)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("spread", [0.4, 1.5])
def test_gspo_matches_the_paper_formula(seed: int, weighted: bool, spread: float) -> None:
    lp, old, adv, mask, w = case(seed, spread=spread)
    w = w if weighted else None
    lp_ = lp.clone().requires_grad_(True)
    out = gspo_loss(lp_, old, adv, mask, clip_ratio_low=EPS_LOW, clip_ratio_high=EPS_HIGH, is_weights=w)
    assert out.pg_loss.item() == pytest.approx(gspo_reference(lp, old, adv, mask, w), rel=1e-7, abs=1e-12)  # verl's +1e-8 in the row mean
    out.pg_loss.backward()
    assert torch.isfinite(lp_.grad).all() and lp_.grad.abs().sum() > 0
    assert (lp_.grad[mask == 0] == 0).all()
    # metrics: clipped term larger, no lower clip, ppo_kl = mean(old − new) over valid tokens
    assert out.pg_clipfrac_lower == 0.0
    assert out.ppo_kl == pytest.approx(float(((old - lp) * mask).sum() / mask.sum()), rel=1e-9)
    clipped, valid = 0, 0
    for i in range(lp.shape[0]):
        n = int(mask[i].sum())
        s = math.exp(float(((lp[i] - old[i]) * mask[i]).sum()) / max(n, 1))
        a = float(adv[i, 0])
        clipped += n * ((a > 0 and s > 1 + EPS_HIGH) or (a < 0 and s < 1 - EPS_LOW))
        valid += n
    assert out.pg_clipfrac == pytest.approx(clipped / valid, rel=1e-7)
    assert out.pg_clipfrac > 0 or spread < 1


def test_gspo_gradient_is_the_sequence_gradient() -> None:
    """Inside the clip range ∂L/∂log π_θ,t = −A_i·s_i / (|y_i|·N): every token of a row gets the same share."""
    lp, old, adv, mask, _ = case(7, spread=0.01)
    lp_ = lp.clone().requires_grad_(True)
    gspo_loss(lp_, old, adv, mask, clip_ratio_low=EPS_LOW, clip_ratio_high=EPS_HIGH).pg_loss.backward()
    n_rows = int((mask.sum(-1) > 0).sum())
    for i in range(lp.shape[0]):
        n = int(mask[i].sum())
        if n == 0:
            continue
        s = math.exp(float(((lp[i] - old[i]) * mask[i]).sum()) / n)
        expect = -float(adv[i, 0]) * s / (n * n_rows)
        assert lp_.grad[i, :n].tolist() == pytest.approx([expect] * n, rel=1e-7)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("weighted", [False, True])
def test_gmpo_matches_the_paper_formula(seed: int, weighted: bool) -> None:
    lp, old, adv, mask, w = case(seed)
    w = w if weighted else None
    lp_ = lp.clone().requires_grad_(True)
    out = geo_mean_loss(lp_, old, adv, mask, clip_ratio_low=EPS_LOW, clip_ratio_high=EPS_HIGH, is_weights=w)
    assert out.pg_loss.item() == pytest.approx(gmpo_reference(lp, old, adv, mask, w), rel=1e-7, abs=1e-8)
    out.pg_loss.backward()
    assert torch.isfinite(lp_.grad).all() and lp_.grad.abs().sum() > 0
    delta = lp - old
    hit = ((delta < -EPS_LOW) | (delta > EPS_HIGH)) & (mask > 0)
    assert out.pg_clipfrac == pytest.approx(float((hit & (adv > 0)).sum() / mask.sum()), rel=1e-7)
    assert out.pg_clipfrac_lower == pytest.approx(float((hit & (adv < 0)).sum() / mask.sum()), rel=1e-7)
    assert out.pg_clipfrac + out.pg_clipfrac_lower > 0


def test_gspo_with_one_token_per_row_is_ppo_clip() -> None:
    """|y_i| = 1: s_i,t is the token ratio, so GSPO is PPO-clip (dual-clip out of reach with c large)."""
    lp, old, adv, _, w = case(3, b=12, r=1, spread=0.5)
    mask = torch.ones_like(lp)
    adv = torch.randn(12, 1, generator=torch.Generator().manual_seed(1), dtype=F64)
    grads = []
    for fn in (gspo_loss, ppo_clip_loss):
        lp_ = lp.clone().requires_grad_(True)
        kw = {"clip_ratio_c": 1e9, "loss_agg_mode": "seq-mean-token-mean"} if fn is ppo_clip_loss else {}
        out = fn(lp_, old, adv, mask, clip_ratio_low=EPS_LOW, clip_ratio_high=EPS_HIGH, is_weights=w, **kw)
        out.pg_loss.backward()
        grads.append((out.pg_loss.item(), lp_.grad.clone(), out.pg_clipfrac))
    assert grads[0][0] == pytest.approx(grads[1][0], rel=1e-12)
    torch.testing.assert_close(grads[0][1], grads[1][1], rtol=1e-12, atol=1e-15)
    assert grads[0][2] == grads[1][2] > 0


def test_masked_garbage_never_reaches_loss_or_gradient() -> None:
    lp, old, adv, mask, _ = case(5)
    lp = lp.masked_fill(mask == 0, float("nan"))
    old = old.masked_fill(mask == 0, float("-inf"))
    for fn in (gspo_loss, geo_mean_loss):
        lp_ = lp.clone().requires_grad_(True)
        out = fn(lp_, old, adv, mask)
        out.pg_loss.backward()
        assert math.isfinite(out.pg_loss.item()) and torch.isfinite(lp_.grad).all()


def make_batch(rollout, mask, adv, **kw) -> TrainBatch:
    b, r = rollout.shape
    ids = torch.zeros(b, r + 2, dtype=torch.long)
    return TrainBatch(input_ids=ids, attention_mask=torch.ones_like(ids), position_ids=ids.clone(),
                      responses=torch.zeros(b, r, dtype=torch.long), response_mask=mask,
                      rollout_log_probs=rollout, advantages=adv, **kw)


def trainer_cfg(**kw) -> SimpleNamespace:
    base = {"clip_ratio_low": EPS_LOW, "clip_ratio_high": EPS_HIGH, "clip_ratio_c": 3.0, "loss_agg_mode": "token-mean",
            "use_kl_loss": False, "kl_loss_coef": 0.01, "kl_loss_type": "low_var_kl", "entropy_coeff": 0.0,
            "loss_mode": "vanilla"}
    return SimpleNamespace(**{**base, **kw})


def rc_cfg(**kw) -> SimpleNamespace:
    base = {"rollout_is": None, "rollout_is_threshold": 2.0, "rollout_is_batch_normalize": False, "rollout_rs": None,
            "rollout_rs_threshold": None, "bypass_mode": True, "loss_type": "ppo_clip"}
    return SimpleNamespace(**{**base, **kw})


@pytest.mark.parametrize("loss_mode", ["gspo", "geo_mean"])
@pytest.mark.parametrize("agg,extra", [("token-mean", {}), ("seq-mean-token-sum", {}),
                                       ("seq-mean-token-mean", {"use_kl_loss": True, "entropy_coeff": 0.01})],
                         ids=["token-mean", "seq-sum", "seq-mean+kl+entropy"])
@pytest.mark.parametrize("rc", [rc_cfg(bypass_mode=False, rollout_is="token", rollout_rs="token_k2",
                                       rollout_rs_threshold=0.05),
                                rc_cfg(rollout_rs="seq_mean_k1", rollout_rs_threshold="0.8_1.25")],
                         ids=["decoupled", "bypass"])
def test_micro_batches_weighted_by_the_effective_mode_give_the_full_gradient(loss_mode, agg, extra, rc) -> None:
    """Σ_i micro_batch_weight(effective mode, mask_i, mask) · L_i has the full mini-batch loss's gradient, whatever
    loss_agg_mode the config names (the sequence modes aggregate per row)."""
    g = torch.Generator().manual_seed(0)
    b, r = 8, 6
    theta0 = torch.randn(b, r, generator=g, dtype=F64)
    rollout = -torch.nn.functional.softplus(theta0 + 0.3 * torch.randn(b, r, generator=g, dtype=F64))
    lengths = torch.tensor([6, 3, 0, 1, 5, 6, 2, 4])
    mask = (torch.arange(r)[None] < lengths[:, None]).double()
    batch = make_batch(rollout, mask, torch.randn(b, 1, generator=g, dtype=F64) * mask, ref_log_probs=rollout - 0.1)
    if not rc.bypass_mode:
        batch.old_log_probs = -torch.nn.functional.softplus(theta0 + 0.1)
        batch, _ = prepare_decoupled(batch, rc)
    cfg = trainer_cfg(loss_mode=loss_mode, loss_agg_mode=agg, **extra)
    loss_fn = build_loss_fn(cfg, rc)
    mode = effective_agg_mode(cfg)
    assert mode == loss_fn.loss_agg_mode == "seq-mean-token-mean"

    def run(rows: list[slice], weight_mode: str = mode) -> torch.Tensor:
        theta = theta0.clone().requires_grad_(True)
        total = torch.zeros((), dtype=F64)
        for sl in rows:
            mb = batch.select(sl)
            loss, _ = loss_fn(-torch.nn.functional.softplus(theta[sl]), torch.sigmoid(theta[sl]), mb)
            total = total + micro_batch_weight(weight_mode, mb.response_mask, batch.response_mask) * loss
        total.backward()
        return theta.grad

    full = run([slice(0, b)])
    split = [slice(0, 3), slice(3, 5), slice(5, 8)]
    micro = run(split)
    assert torch.isfinite(full).all() and full.abs().sum() > 0
    torch.testing.assert_close(micro, full, rtol=0, atol=1e-6)
    if agg == "token-mean":  # weighting by the configured mode's tokens instead would be wrong
        assert (run(split, agg) - full).abs().max() > 1e-3


def test_the_loss_function_dispatches_on_loss_mode() -> None:
    lp, old, adv, mask, _ = case(2)
    batch = make_batch(old, mask, adv)
    values = {m: build_loss_fn(trainer_cfg(loss_mode=m), rc_cfg())(lp, None, batch)[0].item()
              for m in ("vanilla", "gspo", "geo_mean")}
    assert values["gspo"] == pytest.approx(gspo_reference(lp, old, adv, mask), rel=1e-7)
    assert values["geo_mean"] == pytest.approx(gmpo_reference(lp, old, adv, mask), rel=1e-7)
    assert len({round(v, 9) for v in values.values()}) == 3


def test_config_rules_for_the_sequence_modes() -> None:
    assert loss_mode_error(trainer_cfg(loss_mode="gspo")) is None  # KL and entropy off: any agg mode
    assert loss_mode_error(trainer_cfg(loss_mode="gspo", use_kl_loss=True, loss_agg_mode="seq-mean-token-mean")) is None
    assert loss_mode_error(trainer_cfg(loss_mode="sapo")) == (
        "unknown trainer.loss_mode 'sapo'; supported: vanilla, gspo, geo_mean")
    msg = loss_mode_error(trainer_cfg(loss_mode="geo_mean", entropy_coeff=0.01))
    assert msg is not None and "entropy_coeff" in msg and "seq-mean-token-mean" in msg and "\n" not in msg
    with pytest.raises(ValueError, match="use_kl_loss needs loss_agg_mode"):
        build_loss_fn(trainer_cfg(loss_mode="gspo", use_kl_loss=True), rc_cfg())
    with pytest.raises(ValueError, match="loss_type"):
        build_loss_fn(trainer_cfg(loss_mode="gspo"), rc_cfg(loss_type="reinforce"))
    assert effective_agg_mode(trainer_cfg(loss_agg_mode="token-mean")) == "token-mean"
