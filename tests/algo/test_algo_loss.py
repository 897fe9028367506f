"""The trainer-facing LossFn: decoupled and bypass modes, KL / entropy terms, gradient-accumulation equivalence."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from engine.algo.loss import build_loss_fn, micro_batch_weight, prepare_decoupled
from engine.trainer.base import TrainBatch

torch.set_num_threads(1)


def make_batch(rollout: torch.Tensor, mask: torch.Tensor, adv: torch.Tensor, **kw) -> TrainBatch:
    b, r = rollout.shape
    ids = torch.zeros(b, r + 2, dtype=torch.long)
    return TrainBatch(input_ids=ids, attention_mask=torch.ones_like(ids), position_ids=ids.clone(),
                      responses=torch.zeros(b, r, dtype=torch.long), response_mask=mask,
                      rollout_log_probs=rollout, advantages=adv, **kw)


def trainer_cfg(**kw) -> SimpleNamespace:
    base = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "clip_ratio_c": 3.0, "loss_agg_mode": "token-mean",
                "use_kl_loss": False, "kl_loss_coef": 0.001, "kl_loss_type": "low_var_kl", "entropy_coeff": 0.0}
    return SimpleNamespace(**{**base, **kw})


def rc_cfg(**kw) -> SimpleNamespace:
    base = {"rollout_is": None, "rollout_is_threshold": 2.0, "rollout_is_batch_normalize": False, "rollout_rs": None,
                "rollout_rs_threshold": None, "bypass_mode": True, "loss_type": "ppo_clip"}
    return SimpleNamespace(**{**base, **kw})


def test_micro_batch_weight_by_hand() -> None:
    full = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    # token-mean: 5 and 1 of 6 tokens; seq-mean: 2 and 1 of 3 non-empty rows
    assert micro_batch_weight("token-mean", full[:2], full) == pytest.approx(5 / 6)
    assert micro_batch_weight("token-mean", full[2:], full) == pytest.approx(1 / 6)
    assert micro_batch_weight("seq-mean-token-sum", full[:2], full) == pytest.approx(2 / 3)
    assert micro_batch_weight("seq-mean-token-mean", full[2:], full) == pytest.approx(1 / 3)
    assert micro_batch_weight("token-mean", full[2:3], full[2:3]) == 0.0


def test_decoupled_ppo_with_is_weights_by_hand() -> None:
    # π_prox = π_θ (ratio 1): ℓ = −A·w → (−1·2 − (−1)·0.5)/2 = −0.75
    lp = torch.full((1, 2), -1.0, requires_grad=True)
    batch = make_batch(torch.full((1, 2), -2.0), torch.ones(1, 2), torch.tensor([[1.0, -1.0]]),
                       old_log_probs=torch.full((1, 2), -1.0), is_weights=torch.tensor([[2.0, 0.5]]))
    loss, m = build_loss_fn(trainer_cfg(), rc_cfg(bypass_mode=False))(lp, None, batch)
    assert loss.item() == pytest.approx(-0.75)
    assert set(m) == {"actor/pg_loss", "actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl"}
    loss.backward()
    assert lp.grad[0].tolist() == pytest.approx([-1.0, 0.25])  # d/dlogπ of −A·w·r = −A·w/2 at r = 1
    with pytest.raises(ValueError, match="old_log_probs"):
        build_loss_fn(trainer_cfg(), rc_cfg(bypass_mode=False))(lp, None, make_batch(batch.rollout_log_probs,
                                                                                      batch.response_mask,
                                                                                      batch.advantages))


def test_bypass_ppo_clip_uses_rollout_as_old_and_ignores_is_weights() -> None:
    rollout = torch.tensor([[-1.0, -1.2], [-0.5, -0.7]])
    lp = torch.tensor([[-0.9, -1.3], [-0.6, -0.4]])
    batch = make_batch(rollout, torch.ones(2, 2), torch.tensor([[1.0, 1.0], [-1.0, -1.0]]))
    plain, m0 = build_loss_fn(trainer_cfg(), rc_cfg())(lp, None, batch)
    with_is, m1 = build_loss_fn(trainer_cfg(), rc_cfg(rollout_is="token"))(lp, None, batch)
    assert plain.item() == with_is.item()  # IS weights are metrics only under ppo_clip
    assert "rollout_corr/rollout_is_mean" in m1 and "rollout_corr/kl" in m0
    # r = exp(lp − rollout) = [e^.1, e^−.1, e^−.1, e^.3]; ℓ = [−min(e^.1,1.2), −e^−.1, max(e^−.1, .8), max(e^.3, 1.2)]
    e = math.exp
    assert plain.item() == pytest.approx((-e(0.1) - e(-0.1) + e(-0.1) + e(0.3)) / 4, rel=1e-6)


def test_bypass_rejection_zeroes_rows_but_keeps_the_pre_rs_denominator() -> None:
    rollout = torch.tensor([[-1.0], [-1.0]])
    lp = torch.tensor([[-1.0], [-3.0]], requires_grad=True)  # row 1: π_θ/π_rollout = e^−2 → rejected
    batch = make_batch(rollout, torch.ones(2, 1), torch.ones(2, 1))
    loss_fn = build_loss_fn(trainer_cfg(), rc_cfg(rollout_rs="seq_mean_k1", rollout_rs_threshold="0.9_1.1"))
    loss, m = loss_fn(lp, None, batch)
    assert loss.item() == pytest.approx(-0.5)  # (−A·1 + 0) / 2 tokens before RS
    assert m["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(0.5)
    loss.backward()
    assert lp.grad[:, 0].tolist() == pytest.approx([-0.5, 0.0])


def test_bypass_reinforce_applies_sequence_is_weight() -> None:
    # Δ = Σ (log π_θ − log π_rollout) = 0.5 → w = e^0.5 (< C = 2); L = mean(−A·log π·w) = e^0.5
    lp = torch.tensor([[-1.0, -1.0]], requires_grad=True)
    batch = make_batch(torch.tensor([[-1.5, -1.0]]), torch.ones(1, 2), torch.ones(1, 2))
    loss_fn = build_loss_fn(trainer_cfg(), rc_cfg(rollout_is="sequence", loss_type="reinforce"))
    loss, m = loss_fn(lp, None, batch)
    assert loss.item() == pytest.approx(math.exp(0.5), rel=1e-6)
    loss.backward()
    assert lp.grad[0].tolist() == pytest.approx([-math.exp(0.5) / 2] * 2, rel=1e-6)  # w is detached
    assert m["actor/ppo_kl"] == pytest.approx(-0.25) and "actor/pg_clipfrac" not in m


def test_entropy_bonus_and_kl_loss() -> None:
    lp = torch.full((1, 2), -1.0)
    ent = torch.tensor([[0.5, 1.5]])
    batch = make_batch(lp.clone(), torch.ones(1, 2), torch.zeros(1, 2), ref_log_probs=torch.full((1, 2), -1.5))
    cfg = trainer_cfg(entropy_coeff=0.1, use_kl_loss=True, kl_loss_coef=0.5, kl_loss_type="k1")
    loss_fn = build_loss_fn(cfg, rc_cfg())
    assert loss_fn.needs_entropy
    loss, m = loss_fn(lp, ent, batch)
    # A = 0 → pg 0; entropy mean 1.0; k1 KL = 0.5 → L = −0.1·1 + 0.5·0.5 = 0.15
    assert loss.item() == pytest.approx(0.15)
    assert (m["actor/entropy"], m["actor/kl_loss"], m["actor/kl_coef"]) == pytest.approx((1.0, 0.5, 0.5))
    with pytest.raises(ValueError, match="entropy"):
        loss_fn(lp, None, batch)
    with pytest.raises(ValueError, match="ref_log_probs"):
        loss_fn(lp, ent, make_batch(lp.clone(), torch.ones(1, 2), torch.zeros(1, 2)))


def test_empty_micro_batch_gives_zero_loss_with_graph() -> None:
    lp = torch.zeros(2, 2, requires_grad=True)
    loss, m = build_loss_fn(trainer_cfg(), rc_cfg())(lp, None, make_batch(lp.detach(), torch.zeros(2, 2), torch.ones(2, 2)))
    loss.backward()
    assert loss.item() == 0.0 and m == {"actor/pg_loss": 0.0} and not lp.grad.any()


def test_build_rejects_bad_configs() -> None:
    with pytest.raises(ValueError, match="loss_agg_mode"):
        build_loss_fn(trainer_cfg(loss_agg_mode="sum"), rc_cfg())
    with pytest.raises(ValueError, match="clip_ratio_c"):
        build_loss_fn(trainer_cfg(clip_ratio_c=0.5), rc_cfg())
    with pytest.raises(ValueError, match="KL"):
        build_loss_fn(trainer_cfg(kl_loss_type="k9"), rc_cfg())
    with pytest.raises(ValueError, match="seq_mean_k1"):
        build_loss_fn(trainer_cfg(), rc_cfg(rollout_rs="geometric", rollout_rs_threshold="0.99_1.01"))


def test_prepare_decoupled_applies_rs_and_is_to_the_whole_batch() -> None:
    rollout = torch.full((2, 2), -1.0)
    old = torch.tensor([[-1.0, -1.0], [-0.5, -1.0]])  # row 1: π_prox/π_rollout = e^0.5 per geo-mean e^0.25
    adv = torch.ones(2, 2)
    batch = make_batch(rollout, torch.ones(2, 2), adv, old_log_probs=old)
    cfg = rc_cfg(bypass_mode=False, rollout_is="sequence", rollout_rs="seq_mean_k1", rollout_rs_threshold="0.9_1.1")
    new, m = prepare_decoupled(batch, cfg)
    assert new.response_mask.tolist() == [[1.0, 1.0], [0.0, 0.0]]
    assert new.advantages.tolist() == [[1.0, 1.0], [0.0, 0.0]]
    torch.testing.assert_close(new.is_weights, torch.tensor([[1.0, 1.0], [math.exp(0.5)] * 2]))
    assert batch.is_weights is None and batch.response_mask.sum() == 4  # input untouched
    assert m["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="old_log_probs"):
        prepare_decoupled(make_batch(rollout, torch.ones(2, 2), adv), cfg)


def _accumulation_case(mode: str, rc: SimpleNamespace) -> None:
    g = torch.Generator().manual_seed(0)
    b, r = 8, 6
    theta0 = torch.randn(b, r, generator=g)
    rollout = -torch.nn.functional.softplus(theta0 + 0.3 * torch.randn(b, r, generator=g))
    lengths = torch.tensor([6, 3, 0, 1, 5, 6, 2, 4])
    mask = (torch.arange(r)[None] < lengths[:, None]).float()
    adv = torch.randn(b, 1, generator=g) * mask
    batch = make_batch(rollout, mask, adv, ref_log_probs=rollout - 0.1)
    if not rc.bypass_mode:
        batch.old_log_probs = -torch.nn.functional.softplus(theta0 + 0.1)
        batch, _ = prepare_decoupled(batch, rc)
    loss_fn = build_loss_fn(trainer_cfg(loss_agg_mode=mode, use_kl_loss=True, entropy_coeff=0.01), rc)

    def run(rows: list[slice]) -> torch.Tensor:
        theta = theta0.clone().requires_grad_(True)
        total = torch.zeros(())
        for sl in rows:
            mb = batch.select(sl)
            lp = -torch.nn.functional.softplus(theta[sl])
            loss, _ = loss_fn(lp, torch.sigmoid(theta[sl]), mb)
            total = total + micro_batch_weight(mode, mb.response_mask, batch.response_mask) * loss
        total.backward()
        return theta.grad

    full = run([slice(0, b)])
    micro = run([slice(0, 3), slice(3, 5), slice(5, 8)])
    assert full.abs().sum() > 0
    torch.testing.assert_close(micro, full, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
@pytest.mark.parametrize(
    "rc",
    [
        rc_cfg(bypass_mode=False, rollout_is="token", rollout_rs="token_k2", rollout_rs_threshold=0.02),
        rc_cfg(rollout_is="token", rollout_rs="seq_mean_k1", rollout_rs_threshold="0.8_1.25"),
        rc_cfg(loss_type="reinforce", rollout_is="sequence", rollout_rs="token_k1", rollout_rs_threshold=1.3),
    ],
    ids=["decoupled", "bypass-ppo", "bypass-reinforce"],
)
def test_gradient_accumulation_equals_one_big_batch(mode: str, rc: SimpleNamespace) -> None:
    _accumulation_case(mode, rc)
