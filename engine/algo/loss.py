"""The trainer-facing GRPO loss (`LossFn` of `engine.trainer.base`) and its batch-level helpers.

`build_loss_fn(trainer_cfg, rc_cfg)` returns a callable `loss_fn(log_probs [b, R], entropy [b, R] | None,
micro_batch) -> (loss, metrics)`:

    L = L_pg − entropy_coeff · agg(H) + kl_loss_coef · agg(KL(π_θ, π_ref))        (agg = `agg_loss`)

* decoupled mode (`bypass_mode=False`, three policies): L_pg = PPO-clip with ratio π_θ/π_old where
  `batch.old_log_probs` = π_prox, each token's loss multiplied by `batch.is_weights` (π_prox/π_rollout); RS has
  already been applied to `batch.response_mask` by `prepare_decoupled` on the whole batch.
* bypass mode (`bypass_mode=True`, two policies): π_old := `batch.rollout_log_probs`. Per micro-batch, under
  no_grad, `compute_rollout_correction(old = π_θ, rollout)` gives the RS mask, IS weights and `rollout_corr/*`
  metrics, as verl's `compute_policy_loss_bypass_mode` does. `loss_type="ppo_clip"`: PPO-clip with ratio
  π_θ/π_rollout on the RS mask, IS weights are metrics only. `loss_type="reinforce"`: L_pg = agg(−A·log π_θ·w)
  on the RS mask, w the detached IS weight, no clipping.
* `loss_mode` (`trainer.loss_mode`, verl's `policy_loss.loss_mode`): `vanilla` = the PPO-clip above; `gspo` /
  `geo_mean` replace it by GSPO / GMPO (`engine.algo.seq_policy_loss`) with the same π_old (π_prox with the IS
  weights applied in decoupled mode; π_rollout on the RS mask, IS weights as metrics only, in bypass mode — verl
  1dda039's actor workers run the same loss against π_rollout, without RS: its trainer's swap to the bypass loss
  never reaches them, and `import verl` refuses a sequence loss with `rollout_rs` in bypass mode). These aggregate per sequence: the loss's
  `loss_agg_mode` is then seq-mean-token-mean (`engine.config.loss_mode.effective_agg_mode`, which the
  micro-batch weights of `engine.algo.batching` use too).

Normalisation and gradient accumulation: every term is aggregated with the denominator D of the micro-batch's
`batch.response_mask` (tokens for token-mean, non-empty rows for seq-mean-*) — in bypass mode the mask *before*
RS, like verl's global token count — so rejected tokens count as zero loss. A backend that splits a mini-batch
into micro-batches i and backpropagates Σ_i micro_batch_weight(mode, mask_i, full_mask) · L_i obtains exactly the
gradient of the whole mini-batch's loss, since weight_i = D_i / D_full and L_i = N_i / D_i. Averaging each micro
metric with the same weights gives the mini-batch value. With data parallelism, pass the global mask counts
(or multiply the weight by the world size when gradients are averaged across ranks).

The callable has `needs_entropy` (True when entropy_coeff ≠ 0); `actor/entropy` is reported whenever entropy is
passed. The configs must have presets already resolved into the rollout-correction fields.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import torch

from engine.algo.kl import kl_penalty
from engine.algo.policy_loss import AGG_MODES, agg_denominator, agg_loss, ppo_clip_loss, reinforce_loss
from engine.config.rc_config import validate_rc_config
from engine.algo.rollout_correction import compute_rollout_correction
from engine.algo.seq_policy_loss import geo_mean_loss, gspo_loss
from engine.config.loss_mode import LOSS_MODES, SEQ_AGG_MODE, SEQ_LOSS_MODES, effective_agg_mode, loss_mode_error
from engine.trainer.base import TrainBatch

if TYPE_CHECKING:
    from engine.config.schema import RolloutCorrectionConfig, TrainerConfig


def rc_kwargs(rc_cfg: RolloutCorrectionConfig) -> dict[str, Any]:
    """The `compute_rollout_correction` keyword arguments of an `algorithm.rollout_correction` section."""
    return {
        "rollout_is": getattr(rc_cfg, "rollout_is", None),
        "rollout_is_threshold": getattr(rc_cfg, "rollout_is_threshold", 2.0),
        "rollout_is_batch_normalize": bool(getattr(rc_cfg, "rollout_is_batch_normalize", False)),
        "rollout_rs": getattr(rc_cfg, "rollout_rs", None),
        "rollout_rs_threshold": getattr(rc_cfg, "rollout_rs_threshold", None),
    }


def micro_batch_weight(mode: str, mb_mask: torch.Tensor, full_mask: torch.Tensor) -> float:
    """D(mb_mask) / D(full_mask): the factor making Σ_i weight_i · L_i equal the full-batch loss (0 if D_full = 0)."""
    full = agg_denominator(full_mask, mode)
    return agg_denominator(mb_mask, mode) / full if full > 0 else 0.0


def prepare_decoupled(batch: TrainBatch, rc_cfg: RolloutCorrectionConfig) -> tuple[TrainBatch, dict[str, float]]:
    """Decoupled mode, once per batch: rollout correction with old = π_prox (`batch.old_log_probs`) vs π_rollout.

    Returns a new batch with `is_weights` (None when rollout_is is None), the RS-modified `response_mask`
    (advantages, if present, multiplied by it) and the `rollout_corr/*` metrics. A batch whose mask RS zeroed
    entirely comes back with an all-zero mask (`batch.response_mask.sum() == 0`): the caller skips the update.
    """
    if batch.old_log_probs is None:
        raise ValueError("decoupled mode needs batch.old_log_probs (π_prox log-probs) before prepare_decoupled")
    weights, mask, metrics = compute_rollout_correction(
        batch.old_log_probs, batch.rollout_log_probs, batch.response_mask, **rc_kwargs(rc_cfg)
    )
    adv = None if batch.advantages is None else batch.advantages * mask.to(batch.advantages.dtype)
    return dataclasses.replace(batch, response_mask=mask, is_weights=weights, advantages=adv), metrics


@dataclasses.dataclass(frozen=True)
class GRPOLoss:
    """The `LossFn` built by `build_loss_fn` (see the module docstring for the formulas)."""

    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    clip_ratio_c: float = 3.0
    loss_agg_mode: str = "token-mean"
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.001
    kl_loss_type: str = "low_var_kl"
    entropy_coeff: float = 0.0
    bypass_mode: bool = True
    loss_type: str = "ppo_clip"
    rc: dict[str, Any] = dataclasses.field(default_factory=dict)
    loss_mode: str = "vanilla"

    def __post_init__(self) -> None:
        if self.loss_mode not in LOSS_MODES:
            raise ValueError(f"unknown loss_mode {self.loss_mode!r}; supported: {', '.join(LOSS_MODES)}")
        if self.loss_mode in SEQ_LOSS_MODES and self.loss_agg_mode != SEQ_AGG_MODE:
            raise ValueError(f"loss_mode {self.loss_mode!r} aggregates per sequence: loss_agg_mode must be "
                             f"{SEQ_AGG_MODE!r}, got {self.loss_agg_mode!r}")
        if self.loss_mode in SEQ_LOSS_MODES and self.bypass_mode and self.loss_type != "ppo_clip":
            raise ValueError(f"loss_mode {self.loss_mode!r} needs loss_type 'ppo_clip' in bypass mode")

    @property
    def needs_entropy(self) -> bool:
        return self.entropy_coeff != 0.0

    def __call__(
        self, log_probs: torch.Tensor, entropy: torch.Tensor | None, batch: TrainBatch
    ) -> tuple[torch.Tensor, dict[str, float]]:
        mask = batch.response_mask
        if log_probs.shape != mask.shape:
            raise ValueError(f"log_probs {tuple(log_probs.shape)} != response_mask {tuple(mask.shape)}")
        if batch.advantages is None:
            raise ValueError("the micro-batch has no advantages")
        if self.needs_entropy and entropy is None:
            raise ValueError("entropy_coeff != 0 needs the entropy of the policy (compute_log_probs with_entropy)")
        denom = agg_denominator(mask, self.loss_agg_mode)
        if denom == 0:
            return log_probs.sum() * 0.0, {"actor/pg_loss": 0.0}
        metrics: dict[str, float] = {}
        if self.bypass_mode:
            pg = self._bypass(log_probs, batch, denom, metrics)
        else:
            if batch.old_log_probs is None:
                raise ValueError("decoupled mode needs batch.old_log_probs (π_prox)")
            pg = self._clipped(log_probs, batch.old_log_probs, batch.advantages, mask, batch.is_weights, denom)
        metrics.update(pg.metrics())
        loss = pg.pg_loss
        if entropy is not None:
            ent = agg_loss(entropy, mask, self.loss_agg_mode, denom)
            metrics["actor/entropy"] = float(ent.detach().item())
            if self.entropy_coeff != 0.0:
                loss = loss - self.entropy_coeff * ent
        if self.use_kl_loss:
            if batch.ref_log_probs is None:
                raise ValueError("use_kl_loss needs batch.ref_log_probs (reference policy log-probs)")
            kld = kl_penalty(log_probs, batch.ref_log_probs, self.kl_loss_type)
            kl_loss = agg_loss(kld, mask, self.loss_agg_mode, denom)
            loss = loss + self.kl_loss_coef * kl_loss
            metrics["actor/kl_loss"] = float(kl_loss.detach().item())
            metrics["actor/kl_coef"] = self.kl_loss_coef
        return loss, metrics

    def _bypass(self, log_probs: torch.Tensor, batch: TrainBatch, denom: float, metrics: dict[str, float]):
        rollout = batch.rollout_log_probs
        with torch.no_grad():
            weights, rs_mask, rc_metrics = compute_rollout_correction(
                log_probs.detach(), rollout, batch.response_mask, **self.rc
            )
        metrics.update(rc_metrics)
        if self.loss_type == "reinforce":
            return reinforce_loss(log_probs, rollout, batch.advantages, rs_mask, is_weights=weights,
                                  loss_agg_mode=self.loss_agg_mode, denominator=denom)
        return self._clipped(log_probs, rollout, batch.advantages, rs_mask, None, denom)

    def _clipped(self, log_probs: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor,
                 is_weights: torch.Tensor | None, denom: float):
        """The clipped-ratio policy loss of `loss_mode` against π_old = `old`."""
        clip = {"clip_ratio_low": self.clip_ratio_low, "clip_ratio_high": self.clip_ratio_high,
                "is_weights": is_weights, "denominator": denom}
        if self.loss_mode == "gspo":
            return gspo_loss(log_probs, old, adv, mask, **clip)
        if self.loss_mode == "geo_mean":
            return geo_mean_loss(log_probs, old, adv, mask, **clip)
        return ppo_clip_loss(log_probs, old, adv, mask, clip_ratio_c=self.clip_ratio_c,
                             loss_agg_mode=self.loss_agg_mode, **clip)


def build_loss_fn(trainer_cfg: TrainerConfig, rc_cfg: RolloutCorrectionConfig) -> GRPOLoss:
    """A `LossFn` from the trainer's `LossSpec` (`engine.plan.role_parts`; or the `trainer` config section, which has
    the same fields) and the `algorithm.rollout_correction` section (validated here)."""
    mode = getattr(trainer_cfg, "loss_agg_mode", "token-mean")
    if mode not in AGG_MODES:
        raise ValueError(f"unknown loss_agg_mode {mode!r}; expected one of {AGG_MODES}")
    if rc_cfg is not None:
        validate_rc_config(rc_cfg)
    problem = loss_mode_error(trainer_cfg, rc_cfg)
    if problem is not None:
        raise ValueError(problem)
    kl_type = getattr(trainer_cfg, "kl_loss_type", "low_var_kl")
    kl_penalty(torch.zeros(1), torch.zeros(1), kl_type)  # raises on an unknown estimator
    clip_c = float(getattr(trainer_cfg, "clip_ratio_c", 3.0))
    if clip_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be > 1 for dual-clip PPO, got {clip_c}")
    return GRPOLoss(
        clip_ratio_low=float(getattr(trainer_cfg, "clip_ratio_low", 0.2)),
        clip_ratio_high=float(getattr(trainer_cfg, "clip_ratio_high", 0.2)),
        clip_ratio_c=clip_c,
        loss_agg_mode=effective_agg_mode(trainer_cfg),
        use_kl_loss=bool(getattr(trainer_cfg, "use_kl_loss", False)),
        kl_loss_coef=float(getattr(trainer_cfg, "kl_loss_coef", 0.001)),
        kl_loss_type=kl_type,
        entropy_coeff=float(getattr(trainer_cfg, "entropy_coeff", 0.0)),
        bypass_mode=bool(getattr(rc_cfg, "bypass_mode", True)) if rc_cfg is not None else True,
        loss_type=getattr(rc_cfg, "loss_type", "ppo_clip") if rc_cfg is not None else "ppo_clip",
        rc=rc_kwargs(rc_cfg) if rc_cfg is not None else {},
        loss_mode=getattr(trainer_cfg, "loss_mode", "vanilla"),
    )
