"""Optional oracle: our rollout correction and losses vs verl 0.9 itself, on random realistic shapes.

Skipped unless `verl` imports (install it in a scratch venv per the reference §8 and run this file there with
PYTHONPATH pointing at the repo). Values must agree to 1e-5 relative and metric names exactly.
"""

from __future__ import annotations

import math

import pytest
import torch

helper = pytest.importorskip("verl.trainer.ppo.rollout_corr_helper")
core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")

from engine.algo.advantages import broadcast_advantages, grpo_advantages
from engine.algo.kl import kl_penalty
from engine.algo.policy_loss import agg_loss, ppo_clip_loss, reinforce_loss
from engine.algo.rollout_correction import compute_rollout_correction

torch.set_num_threads(1)


def _inputs(seed: int, batch: int = 64, length: int = 96, noise: float = 0.02, bias: float = 0.0):
    """Realistic log-probs: rollout ~ log U(0.05, 1), train = rollout + per-token mismatch noise + a per-row
    bias (staleness drift), right-padded responses of random lengths (every row has ≥ 1 token)."""
    g = torch.Generator().manual_seed(seed)
    rollout = torch.log(torch.rand(batch, length, generator=g) * 0.95 + 0.05)
    drift = bias * torch.randn(batch, 1, generator=g)
    train = rollout + noise * torch.randn(batch, length, generator=g) + drift
    lengths = torch.randint(1, length + 1, (batch,), generator=g)
    mask = (torch.arange(length)[None, :] < lengths[:, None]).float()
    return train, rollout, mask


def _close(ours: dict[str, float], theirs: dict[str, float]) -> None:
    assert sorted(ours) == sorted(theirs)
    for key, ref in theirs.items():
        got = ours[key]
        if math.isinf(ref) or math.isnan(ref):
            assert got == ref or (math.isnan(got) and math.isnan(ref)), key
        else:
            assert got == pytest.approx(ref, rel=1e-5, abs=1e-6), key


CASES = [
    {"rollout_is": "token", "rollout_is_threshold": 2.0},
    {"rollout_is": "sequence", "rollout_is_threshold": 2.0},
    {"rollout_is": "token", "rollout_is_threshold": "0.5_5.0"},
    {"rollout_is": "sequence", "rollout_is_threshold": "0.8_1.25", "rollout_is_batch_normalize": True},
    {"rollout_is": "token", "rollout_is_threshold": 1.5, "rollout_is_batch_normalize": True},
    {"rollout_is": "sequence", "rollout_is_threshold": 2.0, "rollout_rs": "seq_sum_k1", "rollout_rs_threshold": "0.5_2.0"},
    {"rollout_is": "sequence", "rollout_is_threshold": 2.0, "rollout_rs": "seq_mean_k1", "rollout_rs_threshold": "0.999_1.001"},
    {"rollout_is": "token", "rollout_is_threshold": 2.0, "rollout_rs": "seq_mean_k1", "rollout_rs_threshold": "0.9_1.6"},
    {"rollout_rs": "seq_mean_k3", "rollout_rs_threshold": 0.0005},
    {"rollout_rs": "token_k1,seq_max_k2,seq_sum_k3", "rollout_rs_threshold": "1.05,0.002,0.05"},
    {"rollout_rs": "token_k2,token_k3,seq_mean_k2,seq_max_k3", "rollout_rs_threshold": 0.0004},
    {"rollout_is": "sequence", "rollout_rs": "token_k1,seq_mean_k1", "rollout_rs_threshold": "0.97_1.02"},
    {},
]


REGIMES = {"mismatch": (0, 0.02, 0.0), "stale": (1, 0.3, 0.05), "far": (2, 0.8, 0.3)}


@pytest.mark.parametrize("regime", list(REGIMES))
@pytest.mark.parametrize("case", CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) or "none")
def test_rollout_correction_matches_verl(case: dict, regime: str) -> None:
    seed, noise, bias = REGIMES[regime]
    train, rollout, mask = _inputs(seed, noise=noise, bias=bias)
    weights, our_mask, metrics = compute_rollout_correction(train, rollout, mask, **case)
    try:
        proto, v_mask, v_metrics = helper.compute_rollout_correction_and_rejection_mask(train, rollout, mask, **case)
    except ZeroDivisionError:
        # verl's ESS divides by zero when IcePop zeroes every weight; we report ESS = 0 instead.
        assert weights is not None and not weights.any()
        assert metrics["rollout_corr/rollout_is_eff_sample_size"] == 0.0
        return
    torch.testing.assert_close(our_mask, v_mask, rtol=0, atol=0)
    if proto is None:
        assert weights is None
    else:
        torch.testing.assert_close(weights, proto.batch["rollout_is_weights"], rtol=1e-5, atol=1e-7)
    _close(metrics, v_metrics)


def test_metric_count_sequence_is_plus_two_rs_options() -> None:
    train, rollout, mask = _inputs(3)
    kw = {"rollout_is": "sequence", "rollout_rs": "seq_sum_k1,seq_mean_k3", "rollout_rs_threshold": "0.5_2.0,0.01"}
    _, _, v_metrics = helper.compute_rollout_correction_and_rejection_mask(train, rollout, mask, **kw)
    _, _, metrics = compute_rollout_correction(train, rollout, mask, **kw)
    assert set(metrics) == set(v_metrics)


class _Cfg(dict):
    """The bits of verl's ActorConfig that its policy losses read."""

    def __getattr__(self, name):
        return self[name]

    def get(self, key, default=None):
        return super().get(key, default)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_policy_losses_and_agg_match_verl(mode: str) -> None:
    train, old, mask = _inputs(5, batch=16, length=24, noise=0.3)
    g = torch.Generator().manual_seed(7)
    adv = broadcast_advantages(grpo_advantages(torch.randint(0, 2, (16,), generator=g).float(),
                                               [i // 4 for i in range(16)]), mask)
    w = torch.rand(16, 24, generator=g) * 2
    cfg = _Cfg(clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0, global_batch_info={})
    v_loss, v_m = core_algos.compute_policy_loss_vanilla(old, train, adv, mask, mode, cfg, rollout_is_weights=w)
    ours = ppo_clip_loss(train, old, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0,
                         loss_agg_mode=mode, is_weights=w)
    assert ours.pg_loss.item() == pytest.approx(v_loss.item(), rel=1e-5)
    assert ours.metrics()["actor/pg_clipfrac"] == pytest.approx(v_m["actor/pg_clipfrac"], rel=1e-5, abs=1e-7)
    assert ours.metrics()["actor/pg_clipfrac_lower"] == pytest.approx(v_m["actor/pg_clipfrac_lower"], abs=1e-7)
    assert ours.ppo_kl == pytest.approx(v_m["actor/ppo_kl"], rel=1e-5)
    v_r, v_rm = core_algos.compute_policy_loss_reinforce(old, train, adv, mask, mode, cfg, rollout_is_weights=w)
    ours_r = reinforce_loss(train, old, adv, mask, loss_agg_mode=mode, is_weights=w)
    assert ours_r.pg_loss.item() == pytest.approx(v_r.item(), rel=1e-5)
    assert ours_r.ppo_kl == pytest.approx(v_rm["actor/ppo_kl"], rel=1e-5)
    ent = torch.rand(16, 24, generator=g)
    assert agg_loss(ent, mask, mode).item() == pytest.approx(core_algos.agg_loss(ent, mask, mode).item(), rel=1e-5)
    for kind in ("k1", "k2", "low_var_kl", "abs"):
        torch.testing.assert_close(kl_penalty(train, old, kind), core_algos.kl_penalty(train, old, kind))


def test_grpo_advantages_match_verl() -> None:
    g = torch.Generator().manual_seed(11)
    rewards = torch.rand(24, generator=g).round()
    ids = [i % 6 for i in range(23)] + [99]  # interleaved groups plus a singleton
    mask = torch.ones(24, 5)
    import numpy as np

    for norm in (True, False):
        v_adv, _ = core_algos.compute_grpo_outcome_advantage(
            rewards[:, None] * torch.nn.functional.one_hot(torch.full((24,), 4), 5).float(), mask,
            np.array(ids), norm_adv_by_std_in_grpo=norm)
        ours = broadcast_advantages(grpo_advantages(rewards, ids, norm_by_std=norm), mask)
        torch.testing.assert_close(ours, v_adv)


@pytest.mark.parametrize("loss_type", ["ppo_clip", "reinforce"])
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_bypass_loss_fn_matches_verl(loss_type: str, mode: str) -> None:
    """Our bypass LossFn == verl's compute_policy_loss_bypass_mode with the global (pre-RS) batch counts."""
    from types import SimpleNamespace

    from engine.algo.loss import build_loss_fn
    from engine.trainer.base import TrainBatch

    train, rollout, mask = _inputs(9, batch=32, length=40, noise=0.2, bias=0.05)
    g = torch.Generator().manual_seed(3)
    adv = broadcast_advantages(torch.randn(32, generator=g), mask)
    rc = {"rollout_is": "sequence", "rollout_is_threshold": 2.0, "rollout_is_batch_normalize": False,
              "rollout_rs": "seq_mean_k1,token_k2", "rollout_rs_threshold": "0.9_1.2,0.08", "loss_type": loss_type}
    info = {"batch_num_tokens": mask.sum(), "global_batch_size": (mask.sum(-1) > 0).sum()}
    cfg = _Cfg(clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0, global_batch_info=info,
               policy_loss=_Cfg(rollout_correction=_Cfg(rc)))
    lp_v = train.clone().requires_grad_(True)
    v_loss, v_m = core_algos.compute_policy_loss_bypass_mode(rollout, lp_v, adv, mask, mode, cfg)
    v_loss.backward()

    trainer = SimpleNamespace(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0, loss_agg_mode=mode)
    loss_fn = build_loss_fn(trainer, SimpleNamespace(bypass_mode=True, **rc))
    n = 32
    batch = TrainBatch(input_ids=torch.zeros(n, 41, dtype=torch.long), attention_mask=torch.ones(n, 41, dtype=torch.long),
                       position_ids=torch.zeros(n, 41, dtype=torch.long), responses=torch.zeros(n, 40, dtype=torch.long),
                       response_mask=mask, rollout_log_probs=rollout, advantages=adv)
    lp = train.clone().requires_grad_(True)
    loss, metrics = loss_fn(lp, None, batch)
    loss.backward()
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] > 0.0
    assert loss.item() == pytest.approx(v_loss.item(), rel=1e-5)
    torch.testing.assert_close(lp.grad, lp_v.grad, rtol=1e-5, atol=1e-8)
    for key, ref in v_m.items():
        assert metrics[key] == pytest.approx(ref, rel=1e-5, abs=1e-7), key
