"""From queued TrajectoryGroups to a training batch: collation, GRPO advantages, staleness bookkeeping and the
per-step batch metrics (verl names)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from engine.types import TrajectoryGroup

if TYPE_CHECKING:
    from engine.plan.role_parts import BatchPrepSpec

ROW_INDEX = "row_index"
"""`meta` key: each row's position in the local step's batch (a list, so every row selection carries it)."""
AT_VERSION = "at_version"
"""`meta` key: per row, whether all its tokens were generated at the trainer's current version."""


@dataclass
class PreparedBatch:
    batch: Any  # TrainBatch, rows with zero advantage removed when skip_zero_advantage
    metrics: dict[str, Any]
    uids: list[str]
    num_tokens: int


def staleness_of(group: TrajectoryGroup, trainer_version: int) -> int:
    """Versions between the oldest weights that produced any token of the group and the trainer's weights."""
    return trainer_version - group.min_version


def prepare_batch(groups: list[TrajectoryGroup], spec: BatchPrepSpec, pad_token_id: int,
                  trainer_version: int) -> PreparedBatch:
    """Collate the groups (one row per trajectory), attach group-normalised advantages, drop zero-advantage rows
    when `trainer.skip_zero_advantage` (opt-in) and compute reward / length / staleness / partial-rollout metrics;
    `spec`: the trainer's `BatchPrepSpec` (`engine.plan.role_parts`). `meta["row_index"]` numbers the rows, so a
    loss wrapper can tell which rows a micro-batch holds."""
    from engine.algo.advantages import grpo_advantages
    from engine.algo.rc_diagnostics import staleness_histogram
    from engine.trainer.batch import collate

    from engine.algo.policy_loss import agg_denominator

    batch = collate(groups, pad_token_id)
    mode = spec.loss_agg_mode  # the plan's effective aggregation (`effective_agg_mode`)
    # micro-batch mass for gradient accumulation: the loss's own denominator (tokens or non-empty rows; rows
    # for the sequence-level loss modes gspo/geo_mean, whatever loss_agg_mode says)
    batch.meta["micro_weight_fn"] = lambda mb: agg_denominator(mb.response_mask, mode)
    n_per = [len(g.trajectories) for g in groups]
    rewards = torch.tensor([t.reward for g in groups for t in g.trajectories], dtype=torch.float32)
    group_ids = torch.repeat_interleave(torch.arange(len(groups)), torch.tensor(n_per))
    adv = grpo_advantages(rewards, group_ids, norm_by_std=spec.norm_adv_by_std)
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
    if any(t.loss_mask is not None for t in trajs):  # multi-turn (verl's num_turns metrics)
        turns = [t.turns for t in trajs]
        metrics.update({
            "num_turns/mean": sum(turns) / len(turns), "num_turns/max": max(turns), "num_turns/min": min(turns),
            "asyncrl/tools/calls_per_trajectory": sum(t.tool_calls for t in trajs) / len(trajs),
            "asyncrl/tools/masked_tokens": sum(len(t.loss_mask) - sum(t.loss_mask) for t in trajs if t.loss_mask),
        })
    num_tokens = int(batch.attention_mask.sum().item())
    keep = (adv.abs() > 1e-8).nonzero().flatten()
    metrics["asyncrl/zero_adv_fraction"] = 1.0 - len(keep) / len(trajs)
    if spec.skip_zero_advantage and len(keep) < len(trajs):
        batch = batch.select(keep)
        num_tokens = int(batch.attention_mask.sum().item())
    batch.meta[ROW_INDEX] = list(range(len(batch)))  # survives sharding and mini/micro-batching
    batch.meta[AT_VERSION] = [bool(lo == hi == trainer_version) for lo, hi in
                              zip(batch.meta["min_versions"].tolist(), batch.meta["max_versions"].tolist())]
    return PreparedBatch(batch, metrics, [g.prompt.uid for g in groups], num_tokens)


class LogRatioObserver:
    """Wraps a LossFn and watches each row's *first* forward of a local step (PPO epoch 0, stand-in rows
    skipped). It keeps log(π_θ/π_rollout) of the valid tokens (bypass mode's importance-ratio histogram,
    without an extra forward pass) and, for the mismatch check, the log-probs of the *candidate* rows — first
    forwards before any optimizer step of the step (`meta["fresh"]`) of rows generated entirely at the
    trainer's version (`meta["at_version"]`) — while every other row only adds to the drift sums
    Σ (log π_rollout − log π_θ), its tokens and rows. So little more than the candidates travels between ranks."""

    def __init__(self, loss_fn: Any) -> None:
        self.loss_fn = loss_fn
        self.values: list[torch.Tensor] = []
        self.first: list[tuple[int, torch.Tensor]] = []
        self.drift = [0.0, 0.0, 0]  # Σ (rollout − θ) over valid tokens, tokens, rows
        self._rows_seen: set[int] = set()

    @property
    def needs_entropy(self) -> bool:
        return bool(getattr(self.loss_fn, "needs_entropy", False))

    def __call__(self, log_probs: torch.Tensor, entropy: torch.Tensor | None, batch: Any):
        from engine.trainer.batch import is_filler

        rows = batch.meta.get(ROW_INDEX)
        first = batch.meta.get("ppo_epoch", 0) == 0 and not is_filler(batch)
        if first and rows is not None:
            first = not set(rows) <= self._rows_seen  # a micro-batch repeated with weight 0 is seen once
            self._rows_seen.update(rows)
        if first:
            with torch.no_grad():
                self._observe(log_probs.detach().float(), batch, rows)
        return self.loss_fn(log_probs, entropy, batch)

    def _observe(self, lp: torch.Tensor, batch: Any, rows: list[int] | None) -> None:
        mask = batch.response_mask.to(lp.dtype)
        delta = lp - batch.rollout_log_probs.to(lp.dtype)
        self.values.append(delta[mask.bool()].flatten().cpu())
        if rows is None:
            return
        fresh = bool(batch.meta.get("fresh", True))
        at = batch.meta.get(AT_VERSION) or [False] * len(rows)
        for i, row in enumerate(rows):
            tokens = float(mask[i].sum())
            if fresh and at[i]:
                self.first.append((row, lp[i].cpu()))
            elif tokens > 0:
                self.drift[0] += float((-delta[i] * mask[i]).sum())
                self.drift[1] += tokens
                self.drift[2] += 1

    def drain(self) -> dict[str, Any]:
        """What this observer saw since the last drain (for another rank's observer to `extend` with)."""
        out = {"values": self.take(), "first": self.first, "drift": self.drift}
        self.first, self.drift = [], [0.0, 0.0, 0]
        return out

    def extend(self, seen: list[Any]) -> None:
        """Add what the other trainer ranks' observers saw of the same step (`drain()` results, or bare
        log-ratio tensors)."""
        for item in seen:
            if isinstance(item, dict):
                self.first.extend(item["first"])
                self.drift = [a + b for a, b in zip(self.drift, item["drift"])]
                item = item["values"]
            if item.numel():
                self.values.append(item)

    def take(self) -> torch.Tensor:
        out = torch.cat(self.values) if self.values else torch.zeros(0)
        self.values = []
        self._rows_seen = set()
        return out

    def first_pass(self, width: int) -> tuple[list[int], torch.Tensor, list[float]]:
        """The candidate rows seen since the last call, their first-forward log-probs [k, width] and the drift
        sums (Σ rollout − θ, tokens, rows) of the other rows; then forgets them."""
        idx = [row for row, _ in self.first]
        log_probs = torch.zeros(len(idx), width)
        for k, (_, lp) in enumerate(self.first):
            w = min(width, lp.shape[0])
            log_probs[k, :w] = lp[:w]
        drift = self.drift
        self.first, self.drift = [], [0.0, 0.0, 0]
        return idx, log_probs, drift


def mismatch_check(batch: Any, observer: LogRatioObserver, rc: Any, version: int,
                   weights_moved: bool) -> tuple[dict[str, Any], list[str]]:
    """The step's `asyncrl/mismatch/*` metrics and alarm messages (`engine.algo.mismatch`).

    Decoupled mode compares π_prox (`batch.old_log_probs`, the snapshot of version `version`) with π_rollout
    on the rows generated entirely at `version`. Bypass mode compares the first-forward log-probs of the
    observer's candidate rows (generated at `version`, forwarded before the step's first update), which are
    at version `version`'s weights only when no optimizer step happened since the sync (`weights_moved`
    False); otherwise they are drift too."""
    from engine.algo.mismatch import PREFIX, mismatch_report, same_weight_rows

    drift_keys = (f"{PREFIX}drift_kl", f"{PREFIX}drift_rows")
    bounds = {"kl_bound": rc.mismatch_kl_bound, "ppl_ratio_bound": rc.mismatch_ppl_ratio_bound,
              "chi2_bound": rc.mismatch_chi2_bound}
    if len(batch) == 0 or not rc.bypass_mode:
        observer.first_pass(0)
        if len(batch) == 0 or batch.old_log_probs is None:
            return {}, []
        same = same_weight_rows(batch.meta["min_versions"], batch.meta["max_versions"], version)
        return mismatch_report(batch.old_log_probs, batch.rollout_log_probs, batch.response_mask, same, **bounds)
    idx, train, drift = observer.first_pass(batch.response_mask.shape[1])
    rows = torch.tensor(idx, dtype=torch.long)
    rollout, mask = batch.rollout_log_probs[rows].float(), batch.response_mask[rows].float()
    out: dict[str, Any] = {f"{PREFIX}rows": 0}
    alarms: list[str] = []
    if weights_moved:  # the trainer moved since the sync: the candidates drifted too
        drift[0] += float(((rollout - train) * mask).sum())
        drift[1] += float(mask.sum())
        drift[2] += int((mask.sum(-1) > 0).sum())
    elif idx:
        report, alarms = mismatch_report(train, rollout, mask, torch.ones(len(idx), dtype=torch.bool), **bounds)
        out.update({k: v for k, v in report.items() if k not in drift_keys})
    out[f"{PREFIX}drift_rows"] = int(drift[2])
    if drift[1] > 0:
        out[f"{PREFIX}drift_kl"] = drift[0] / drift[1]
    return out, alarms


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
