"""`LoopParams`: everything the two loop cores take from a run's config, built by ONE function, `loop_params`.

The run (`engine.plan.roles`), `asyncrl plan` (`engine.predict.costs.Layout`) and the simulator
(`engine.loop.sim.scenario.Scenario.loop`, whose random draws are config values) all call `loop_params`; no other
code constructs a `RolloutParams` or a `TrainerParams`. The mapping, with R = prompts per local step, N = local
steps per sync and P = prompts the stream holds:

    R                  = trainer.ppo_mini_batch_size × async_training.require_batches
    N                  = async_training.trigger_parameter_sync_step
    sync_mode          = async_training.mode == "sync"
    staleness in force = 0 in sync mode, else async_training.staleness_threshold   (`budget.staleness_in_force`)
    partial rollout    = async_training.partial_rollout ∧ ¬sync_mode ∧ ¬trainer.deterministic
                                                                          (`rollout.partial_rollout_in_force`)
    versions           = trainer.total_steps, else ⌊P / (R · N)⌋                    (`train_versions`)
    total_local_steps  = versions × N
    seqs_per_call      = max(rollout.n, rollout.max_num_seqs)
    deterministic      = trainer.deterministic: syncs wait for the loaded version's work (rollout) and batches
                         are ordered by prompt (trainer: `ordered`)
    agent              = the multi-turn limits when rollout.multi_turn.enable (None: single-turn)
    filter_metric      = algorithm.filter_groups.metric when dynamic sampling is on (None: every group trained)
    validate_at_end    = trainer.test_freq > 0

Live knob changes (`trigger_parameter_sync_step`, `staleness_threshold`) reach the running cores through their
inboxes (`engine.loop.knobs`); `LoopParams.with_knobs` is the same change applied before the start (what a plan's
sweep asks about). Pure Python: the config is read by attribute only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from engine.loop.agent import AgentLimits
from engine.loop.budget import staleness_in_force
from engine.loop.rollout import RolloutParams, partial_rollout_in_force
from engine.loop.trainer import TrainerParams

if TYPE_CHECKING:
    from engine.config.schema import RunConfig


def prompts_per_step(cfg: RunConfig) -> int:
    """R = ppo_mini_batch_size × require_batches: the prompt groups of one local step."""
    return cfg.trainer.ppo_mini_batch_size * cfg.async_training.require_batches


def train_versions(total_steps: int | None, total_rollout_steps: int | None, per_version: int) -> int | None:
    """Policy versions a run trains: `trainer.total_steps` when set, else ⌊P / (R · N)⌋ (verl's
    `total_train_steps`); None when neither is known."""
    if total_steps is not None:
        return total_steps
    if total_rollout_steps is None:
        return None
    return int(total_rollout_steps / per_version)


@dataclass(frozen=True)
class LoopParams:
    """The rollout core's and the trainer core's parameters of one run, and the prompt stream's length."""

    rollout: RolloutParams
    trainer: TrainerParams
    total_rollout_steps: int
    """P: prompts the run's stream holds (`min(rollout.total_rollout_steps, train size × total_epochs)`)."""

    @property
    def n(self) -> int:
        return self.rollout.n

    @property
    def required_samples(self) -> int:
        return self.rollout.required_samples

    @property
    def trigger(self) -> int:
        return self.rollout.trigger

    @property
    def staleness(self) -> float:
        """The staleness threshold in force (0 in sync mode)."""
        return self.rollout.staleness_threshold

    @property
    def sync_mode(self) -> bool:
        return self.rollout.sync_mode

    @property
    def mode(self) -> str:
        return "sync" if self.sync_mode else "async"

    @property
    def dynamic_sampling(self) -> bool:
        return self.trainer.filter_metric is not None

    @property
    def multi_turn(self) -> bool:
        return self.rollout.agent is not None

    def with_knobs(self, *, trigger: int | None = None, staleness_threshold: float | None = None) -> LoopParams:
        """These params after a knob change before the start: both cores take the new sync interval, the
        staleness (0 in sync mode, as the knob router refuses it there) reaches the rollout's budget and the
        trainer's reported bound."""
        t = self.trigger if trigger is None else max(1, int(trigger))
        s = self.staleness if staleness_threshold is None else staleness_in_force(staleness_threshold,
                                                                                   self.sync_mode)
        versions = self.trainer.total_local_steps // max(1, self.trigger)
        return LoopParams(replace(self.rollout, trigger=t, staleness_threshold=s),
                          replace(self.trainer, trigger=t, staleness_threshold=s, total_local_steps=versions * t),
                          self.total_rollout_steps)

    def for_versions(self, versions: int, keep_rate: float = 1.0) -> LoopParams:
        """The same loop run for `versions` versions (what a plan simulates): V · N local steps, and a stream of
        ⌈(G + 4·√(G·(1 − K))) / K⌉ prompts for G = V · N · R trained groups when dynamic sampling keeps each
        sampled group with probability K (the kept count of P prompts has mean P·K and standard deviation
        √(P·K·(1 − K)): four of them to spare, so the stream does not run dry before the last step; the surplus is
        left unused). K = 1: exactly G."""
        steps = versions * self.trigger
        k = max(1e-6, min(1.0, keep_rate))
        groups = steps * self.required_samples
        prompts = math.ceil((groups + 4 * math.sqrt(groups * (1 - k))) / k)
        return LoopParams(self.rollout, replace(self.trainer, total_local_steps=steps), prompts)


def loop_params(cfg: RunConfig, total_rollout_steps: int) -> LoopParams:
    """The loop cores' parameters of `cfg` whose prompt stream holds `total_rollout_steps` prompts (the mapping
    of the module docstring)."""
    ac, ro, tr = cfg.async_training, cfg.rollout, cfg.trainer
    sync, det = ac.mode == "sync", tr.deterministic
    req, trigger = prompts_per_step(cfg), ac.trigger_parameter_sync_step
    staleness = staleness_in_force(ac.staleness_threshold, sync)
    versions = train_versions(tr.total_steps, total_rollout_steps, req * trigger) or 0
    mt = ro.multi_turn
    agent = AgentLimits(cfg.data.max_response_length, mt.max_assistant_turns, mt.max_user_turns,
                        mt.max_parallel_calls, mt.max_tokens_per_turn) if mt.enable else None
    fg = cfg.algorithm.filter_groups
    rollout = RolloutParams(n=ro.n, max_new_tokens=cfg.data.max_response_length, required_samples=req,
                            staleness_threshold=staleness, trigger=trigger,
                            partial_rollout=partial_rollout_in_force(ac.partial_rollout, sync, det),
                            seqs_per_call=max(ro.n, ro.max_num_seqs), test_freq=tr.test_freq, sync_mode=sync,
                            deterministic=det, agent=agent, val_n=ro.val_n)
    trainer = TrainerParams(required_samples=req, trigger=trigger, total_local_steps=versions * trigger,
                            sync_mode=sync, max_staleness_versions=ac.max_staleness_versions,
                            stale_policy=ac.stale_policy, checkpoint_every_versions=cfg.checkpoint.every_versions,
                            ordered=det, staleness_threshold=staleness, validate_at_end=tr.test_freq > 0,
                            filter_metric=fg.metric if fg.enable else None)
    return LoopParams(rollout, trainer, total_rollout_steps)
