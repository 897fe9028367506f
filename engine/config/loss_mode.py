"""The policy-loss choice `trainer.loss_mode` (verl's `actor.policy_loss.loss_mode`) and its rules. Pure Python.

* `vanilla`  — PPO-clip with dual-clip, aggregated with `trainer.loss_agg_mode` (`engine.algo.policy_loss`).
* `gspo`     — GSPO, a sequence-level ratio (arXiv 2507.18071), aggregated seq-mean-token-mean.
* `geo_mean` — GMPO, the geometric mean of token ratios (arXiv 2507.20673), one loss per row, mean over rows.
  (both in `engine.algo.seq_policy_loss`)

Both sequence modes aggregate their policy term per sequence whatever `loss_agg_mode` says, as verl does. The
trainers weight micro-batch i by D_i / D_full with D the denominator of the loss's *effective* aggregation
(`effective_agg_mode`: seq-mean-token-mean for gspo/geo_mean, D = non-empty rows), so gradient accumulation
stays exact. verl aggregates the KL-loss and entropy terms with `loss_agg_mode` even then; asyncrl would
aggregate them seq-mean-token-mean, so a sequence mode with a KL loss or an entropy bonus requires
`loss_agg_mode = "seq-mean-token-mean"` (`loss_mode_error`). With both off any `loss_agg_mode` is accepted.
"""

from __future__ import annotations

from typing import Any

LOSS_MODES: tuple[str, ...] = ("vanilla", "gspo", "geo_mean")
SEQ_LOSS_MODES: tuple[str, ...] = ("gspo", "geo_mean")
SEQ_AGG_MODE = "seq-mean-token-mean"


def effective_agg_mode(trainer: Any) -> str:
    """The aggregation the loss of `trainer` (a `trainer` section) actually uses, hence the micro-batch weights'."""
    if getattr(trainer, "loss_mode", "vanilla") in SEQ_LOSS_MODES:
        return SEQ_AGG_MODE
    return getattr(trainer, "loss_agg_mode", "token-mean")


def loss_mode_error(trainer: Any, rc: Any = None) -> str | None:
    """One line saying why `trainer.loss_mode` cannot run with these settings, or None.

    `rc` is the `algorithm.rollout_correction` section (None: defaults, bypass mode with ppo_clip)."""
    mode = getattr(trainer, "loss_mode", "vanilla")
    if mode not in LOSS_MODES:
        return f"unknown trainer.loss_mode {mode!r}; supported: {', '.join(LOSS_MODES)}"
    if mode == "vanilla":
        return None
    agg = getattr(trainer, "loss_agg_mode", "token-mean")
    terms = [name for name, on in (("use_kl_loss", bool(getattr(trainer, "use_kl_loss", False))),
                                   ("entropy_coeff", float(getattr(trainer, "entropy_coeff", 0.0)) != 0.0)) if on]
    if terms and agg != SEQ_AGG_MODE:
        return (f"trainer.loss_mode = {mode!r} with {' and '.join(terms)} needs loss_agg_mode = {SEQ_AGG_MODE!r} "
                f"(the policy term is aggregated per sequence; got {agg!r})")
    if rc is not None and bool(getattr(rc, "bypass_mode", True)) and getattr(rc, "loss_type", "ppo_clip") != "ppo_clip":
        return (f"trainer.loss_mode = {mode!r} is a clipped ratio loss: it cannot run with bypass-mode "
                f"loss_type = {getattr(rc, 'loss_type', None)!r} (use loss_type = \"ppo_clip\")")
    return None
