"""From queued TrajectoryGroups to a training batch: collation, GRPO advantages, staleness bookkeeping and the
per-step batch metrics (verl names)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from engine.types import TrajectoryGroup


@dataclass
class PreparedBatch:
    batch: Any  # TrainBatch, rows with zero advantage removed when skip_zero_advantage
    metrics: dict[str, Any]
    uids: list[str]
    num_tokens: int


def staleness_of(group: TrajectoryGroup, trainer_version: int) -> int:
    """Versions between the oldest weights that produced any token of the group and the trainer's weights."""
    return trainer_version - group.min_version


def prepare_batch(groups: list[TrajectoryGroup], cfg: Any, pad_token_id: int, trainer_version: int) -> PreparedBatch:
    """Collate the groups (one row per trajectory), attach group-normalised advantages, drop zero-advantage rows
    (they carry no policy gradient) and compute reward / length / staleness / partial-rollout metrics."""
    from engine.algo.advantages import grpo_advantages
    from engine.algo.rc_diagnostics import staleness_histogram
    from engine.trainer.batch import collate

    from engine.algo.policy_loss import agg_denominator

    batch = collate(groups, pad_token_id)
    mode = cfg.trainer.loss_agg_mode
    # micro-batch mass for gradient accumulation: the loss's own denominator (tokens or non-empty rows)
    batch.meta["micro_weight_fn"] = lambda mb: agg_denominator(mb.response_mask, mode)
    n_per = [len(g.trajectories) for g in groups]
    rewards = torch.tensor([t.reward for g in groups for t in g.trajectories], dtype=torch.float32)
    group_ids = torch.repeat_interleave(torch.arange(len(groups)), torch.tensor(n_per))
    adv = grpo_advantages(rewards, group_ids, norm_by_std=cfg.algorithm.norm_adv_by_std_in_grpo)
    batch.advantages = adv[:, None] * batch.response_mask

    trajs = [t for g in groups for t in g.trajectories]
    lengths = batch.response_mask.sum(-1)
    stal = [trainer_version - t.min_version for t in trajs]
    spans = [t.version_span for t in trajs]
    partial = [s for s in spans if s > 0]
    metrics: dict[str, Any] = {
        "critic/rewards/mean": rewards.mean().item(),
        "critic/rewards/max": rewards.max().item(),
        "critic/rewards/min": rewards.min().item(),
        "critic/score/mean": rewards.mean().item(),
        "critic/advantages/mean": adv.mean().item(),
        "critic/advantages/max": adv.max().item(),
        "critic/advantages/min": adv.min().item(),
        "response_length/mean": lengths.float().mean().item(),
        "response_length/max": lengths.max().item(),
        "response_length/min": lengths.min().item(),
        "response_length/clip_ratio": sum(t.finish_reason == "length" for t in trajs) / len(trajs),
        "asyncrl/staleness/mean": sum(stal) / len(stal),
        "asyncrl/staleness/max": max(stal),
        "asyncrl/staleness_hist": staleness_histogram(stal),
        "fully_async/partial/total_partial_num": len(partial),
        "fully_async/partial/partial_ratio": len(partial) / len(trajs),
        "fully_async/partial/max_partial_span": max(spans),
        "asyncrl/stale_trajectories": sum(1 for t in trajs if trainer_version - t.max_version >= 1),
        "asyncrl/finish/abort_ratio": sum(t.finish_reason == "abort" for t in trajs) / len(trajs),
    }
    num_tokens = int(batch.attention_mask.sum().item())
    if cfg.trainer.skip_zero_advantage:
        keep = (adv.abs() > 1e-8).nonzero().flatten()
        metrics["asyncrl/zero_adv_fraction"] = 1.0 - len(keep) / len(trajs)
        if len(keep) < len(trajs):
            batch = batch.select(keep)
            num_tokens = int(batch.attention_mask.sum().item())
    return PreparedBatch(batch, metrics, [g.prompt.uid for g in groups], num_tokens)


class LogRatioObserver:
    """Wraps a LossFn and keeps log(π_θ/π_rollout) of every valid token it sees (bypass mode), so the step can
    report the importance-ratio histogram without an extra forward pass."""

    def __init__(self, loss_fn: Any) -> None:
        self.loss_fn = loss_fn
        self.values: list[torch.Tensor] = []

    @property
    def needs_entropy(self) -> bool:
        return bool(getattr(self.loss_fn, "needs_entropy", False))

    def __call__(self, log_probs: torch.Tensor, entropy: torch.Tensor | None, batch: Any):
        with torch.no_grad():
            delta = log_probs.detach() - batch.rollout_log_probs
            self.values.append(delta[batch.response_mask.bool()].flatten())
        return self.loss_fn(log_probs, entropy, batch)

    def extend(self, values: list[torch.Tensor]) -> None:
        """Add log-ratios observed elsewhere (the other trainer ranks' rows of the same step)."""
        self.values.extend(v for v in values if v.numel())

    def take(self) -> torch.Tensor:
        out = torch.cat(self.values) if self.values else torch.zeros(0)
        self.values = []
        return out


def is_ratio_metrics(log_ratio: torch.Tensor) -> dict[str, Any]:
    """The token importance ratios π_train/π_rollout = exp(log_ratio) of a step (π_train = π_θ in bypass mode,
    π_prox in decoupled mode): mean/min/max and a log-spaced histogram. Reported whether or not IS weights are
    applied, so the off-policy gap is always visible."""
    from engine.algo.rc_diagnostics import is_weight_histogram

    w = torch.exp(log_ratio.clamp(-20, 20))
    if w.numel() == 0:
        return {}
    return {"asyncrl/is_ratio/mean": w.mean().item(), "asyncrl/is_ratio/min": w.min().item(),
            "asyncrl/is_ratio/max": w.max().item(), "asyncrl/is_hist": is_weight_histogram(w, torch.ones_like(w))}
