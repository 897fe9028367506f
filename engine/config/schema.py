"""The run-config schema: pydantic v2 models, one per TOML table, and `RunConfig`, the whole run.

It lives in the engine because the engine runs on it: the CLI validates a run file into a `RunConfig`
(importing it from here) and hands the engine a `RunPlan` holding it
(`engine.plan.run_plan`); the engine's actors read the typed sections they need. The sections of the
model, data, resources, optimizer, trainer and rollout are in `engine.config.sections`.

Names follow verl where verl has the concept, so a verl script maps one to one (`asyncrl import verl`).
Every model forbids unknown keys, and every field has an attribute docstring: it becomes the field's
description in the JSON Schema (`asyncrl schema`) and in CLI help. Knobs the running controller may change
are the knob table's (`engine.control.knobs.KNOB_SPECS`, each with its `config_path`);
the CLI's `schema_paths.runtime_knobs()` lists their fields, and the JSON Schema marks those, and
only those, `x-runtime-mutable`.

Single-field formats (ranges, enumerations, verl's rollout-correction spec strings) are validated here;
rules that relate several fields live in the CLI's config checks, where they can name file
and line.

This module must stay importable without torch, ray, vllm or transformers.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from engine.config.rc_config import parse_is_threshold, parse_rs_options, parse_rs_thresholds
from engine.config.sections import (
    DataConfig,
    ModelConfig,
    NodeGroup,
    OptimConfig,
    ResourcesConfig,
    RolloutConfig,
    Section,
    TrainerConfig,
)

__all__ = [
    "SCHEMA_VERSION", "AlgorithmConfig", "AsyncTrainingConfig", "CheckpointConfig", "DataConfig", "DebugConfig",
    "LoggingConfig", "ModelConfig", "NodeGroup", "OptimConfig", "ResourcesConfig", "RolloutConfig",
    "RolloutCorrectionConfig", "RunConfig", "Section", "TrainerConfig",
]  # fmt: skip

SCHEMA_VERSION = 1
"""Bumped when a key is renamed or removed (no aliases are kept: the old spelling fails loudly)."""

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class AsyncTrainingConfig(Section):
    """Asynchrony (`[async_training]`, verl's keys and meaning)."""

    mode: Literal["fully_async", "sync"] = "fully_async"
    """`fully_async` = rollout and training overlap; `sync` = the on-policy baseline with the same code
    (the staleness threshold is forced to 0)."""
    staleness_threshold: float = Field(0.1, ge=0)
    """Extra fraction of a sync cycle's prompts the rollouter may generate ahead:
    max_required_samples = required_samples × (1 + staleness_threshold) × trigger_parameter_sync_step."""
    trigger_parameter_sync_step: int = Field(4, gt=0)
    """Local trainer steps per weight sync (one policy version = this many steps)."""
    require_batches: int = Field(1, gt=0)
    """`ppo_mini_batch_size` prompt groups the trainer pulls per local step."""
    partial_rollout: bool = Field(True)
    """True: generations interrupted by a weight sync resume from their prefix under the new weights.
    False: at a sync, in-flight generations are aborted and their samples dropped (counted in the ledger),
    as current verl does."""
    max_staleness_versions: int | None = Field(None, ge=0)
    """Hard cap: a trajectory whose oldest token is more than this many versions behind is handled by
    `stale_policy` (None = no cap, verl's fully-async behaviour)."""
    stale_policy: Literal["drop", "wait"] = "drop"
    """What happens to a trajectory over `max_staleness_versions`: `drop` it, or make rollout `wait`."""


class RolloutCorrectionConfig(Section):
    """Rollout correction (`[algorithm.rollout_correction]`, verl's keys): importance sampling (IS) and
    rejection sampling (RS) against the rollout/trainer mismatch."""

    preset: str | None = None
    """Name of a verl preset (e.g. `decoupled_geo_rs`, `bypass_ppo_clip`): expands to the keys below;
    keys written explicitly win. See `asyncrl presets show rollout-correction`."""
    rollout_is: Literal["token", "sequence"] | None = None
    """IS aggregation: `token`, `sequence`, or absent (off)."""
    rollout_is_threshold: float | str = Field(2.0)
    """Upper clamp C of the truncated IS weight min(w, C); a `"lower_upper"` string (e.g. `"0.5_5.0"`)
    selects IcePop (weights outside the band become 0)."""
    rollout_is_batch_normalize: bool = False
    """Divide the IS weights by their batch mean after truncation."""
    rollout_rs: str | None = None
    """Comma-separated RS options, all must pass: token_k1..3, seq_sum_k1..3, seq_mean_k1..3, seq_max_k2,
    seq_max_k3. (verl's removed values `token`, `sequence`, `geometric` are rejected.)"""
    rollout_rs_threshold: float | str | None = None
    """One spec per RS option (a single spec is broadcast): k1 takes `"lower_upper"` or an upper bound u
    (lower = 1/u); k2/k3 take a positive upper bound."""
    bypass_mode: bool = True
    """True: π_old := π_rollout (two policies; IS/RS act per micro-batch against π_θ). False: decoupled
    (three policies; π_old is the proximal snapshot recomputed by the trainer)."""
    loss_type: Literal["ppo_clip", "reinforce"] = "ppo_clip"
    """Bypass-mode loss: `ppo_clip` (IS weights are logged, not applied) or `reinforce` (weighted by the
    truncated IS weight)."""
    mismatch_kl_bound: float = Field(0.05, gt=0)
    """Alarm when the rollout/trainer KL exceeds this bound."""
    mismatch_ppl_ratio_bound: float = Field(1.2, gt=1)
    """Alarm when the perplexity ratio leaves [1/b, b]."""
    mismatch_chi2_bound: float = Field(1.0, gt=0)
    """Alarm when the token χ² divergence exceeds this bound."""

    @field_validator("rollout_is_threshold")
    @classmethod
    def _is_threshold(cls, v: float | str) -> float | str:
        parse_is_threshold(v)
        return v

    @field_validator("rollout_rs")
    @classmethod
    def _rs(cls, v: str | None) -> str | None:
        if v is not None:
            parse_rs_options(v)
        return v

    @field_validator("preset")
    @classmethod
    def _preset(cls, v: str | None) -> str | None:
        from engine.config.rc_presets import RC_PRESETS, canonical_preset_name

        if v is not None and canonical_preset_name(v) not in RC_PRESETS:
            raise ValueError(f"unknown rollout-correction preset {v!r}")
        return v

    def rs_specs(self) -> list[tuple[str, float | None, float]]:
        """The RS options with their (lower, upper) bounds, parsed; empty when RS is off."""
        if self.rollout_rs is None:
            return []
        opts = parse_rs_options(self.rollout_rs)
        if self.rollout_rs_threshold is None:
            return []
        return [(th.option, th.lower, th.upper) for th in parse_rs_thresholds(opts, self.rollout_rs_threshold)]


class FilterGroupsConfig(Section):
    """Dynamic sampling (DAPO; verl's `algorithm.filter_groups`). A group whose responses all scored alike has
    the GRPO advantage A_i = (r_i − mean r) / (std r + ε) = 0 for every response: no policy gradient, only
    compute (and, with Adam, a step along the old momentum). With `enable` the trainer drops such a group as
    it arrives (ledger status `dropped`, reason `filtered`; `asyncrl/count/filtered_groups`), its prompt leaves
    the rollout budget, and the rollouter samples further prompts until a local step has `required_samples`
    groups that carry a gradient. If a fraction f of groups is uniform, a trained group costs 1 / (1 − f)
    sampled prompts. The prompts are finite: `total_rollout_steps` then feeds fewer local steps, and the run
    ends when they run out (raise it, or set `trainer.total_steps`). A group of one response is kept (verl)."""

    enable: bool = False
    """Drop groups whose `metric` does not vary (off = verl's default: every group is trained)."""
    metric: Literal["score", "acc", "seq_reward", "seq_final_reward"] = "score"
    """What must vary within a group: `score` = the reward the advantage is computed from (verl's `seq_reward`
    and `seq_final_reward` are the same value in asyncrl, which adds no KL penalty to the reward); `acc` = the
    reward function's `acc` entry (the run fails with a clear message when the function returns none)."""


class AlgorithmConfig(Section):
    """Advantage estimation, dynamic sampling and rollout correction (`[algorithm]`)."""

    adv_estimator: Literal["grpo"] = "grpo"
    """Advantage estimator: GRPO, A_i = (r_i − mean(r)) / (std(r) + ε) within each prompt's group."""
    norm_adv_by_std_in_grpo: bool = True
    """Divide by the group's reward std (False = Dr.GRPO, centring only)."""
    filter_groups: FilterGroupsConfig = Field(default_factory=FilterGroupsConfig)
    """Dynamic sampling: drop the groups that carry no gradient and sample more (off by default)."""
    rollout_correction: RolloutCorrectionConfig = Field(default_factory=RolloutCorrectionConfig)
    """Importance sampling and rejection sampling against train/inference mismatch and staleness."""


class CheckpointConfig(Section):
    """Checkpoints (`[checkpoint]`)."""

    every_versions: int = Field(0, ge=0)
    """Save every N policy versions (0 = only on demand, at a graceful stop and at the end). A checkpoint
    holds the trainer's weights, optimizer and RNG states, the version and step, the prompt stream's
    position, the queued groups and the in-flight prompts with their partial responses; `asyncrl launch
    RUN.toml --resume auto` continues from the newest intact one."""
    keep_last: int = Field(2, gt=0)
    """Checkpoints kept on disk (older ones are deleted after a new one is complete)."""
    dir: str | None = None
    """Checkpoint directory (None = `<run_dir>/checkpoints`); one `global_step_<step>/` per checkpoint."""


class LoggingConfig(Section):
    """Run directory and metric sinks (`[logging]`)."""

    run_dir: str = "runs/${name}"
    """Run directory; `${name}` is replaced by the run name (config.resolved.json, metrics.jsonl,
    events.jsonl and checkpoints/ go there)."""
    sinks: list[Literal["jsonl", "console", "tensorboard", "wandb"]] = ["jsonl", "console"]
    """Metric sinks; jsonl is always written."""
    project: str = "asyncrl"
    """Project name for wandb/tensorboard."""
    aggregate: Literal["step", "version"] = "step"
    """Record rate and x-axis of the tensorboard / wandb sinks: `step` = one record per local step at
    `training/global_step`; `version` = verl's way, one record per parameter version at its version (means
    of the per-step values, `timing_s/*` summed, counters last). metrics.jsonl and the dashboard keep every
    step either way."""
    progress: bool = True
    """Show a progress line on the console."""


class DebugConfig(Section):
    """Fault injection for tests (`[debug]`)."""

    kill_replica_at_step: int | None = Field(None, ge=0)
    """Kill rollout replica 0's process (`os._exit`) once the rollouter learns that the trainer reached this
    local step (tests replica recovery; None or 0 = off). Fires once per launch, and not on a resume from a
    checkpoint at or after this step."""
    kill_trainer_at_step: int | None = Field(None, ge=0)
    """Kill the trainer's process (`os._exit`) right after this local step (tests failure reporting and
    resume; None or 0 = off). A resume from an earlier checkpoint reaches the step again: pass
    `--set debug.kill_trainer_at_step=0` to resume past it."""
    stop_at_step: int | None = Field(None, ge=0)
    """Ask for a graceful stop (as `asyncrl ctl RUN stop` or SIGTERM do) at the step boundary after this local
    step: the stop checkpoint is cut there (tests a resume from a chosen step, between two syncs or at one;
    None or 0 = off). Fires once per launch, and not on a resume from a checkpoint at or after this step."""
    corrupt_sync_bucket: int | None = Field(None, ge=0)
    """Flip one byte of this weight-sync bucket (0-based) on the trainer after its checksum was taken, as a
    fault on the wire would, at every sync (tests the delivery check: the run fails naming the replica and
    the bucket; None = off)."""
    kill_replica_mid_sync_file: str | None = None
    """An absolute path: whenever that file exists as a rollout replica receives the second bucket of a weight
    sync (the first received and loaded, the rest in flight), the replica deletes it and kills its own process
    (SIGKILL) — a receiver killed mid-transfer, at a moment the caller picks by creating the file (the soak does;
    `engine.runtime.replica.killed_mid_transfer`; `hf` replicas; None = off)."""


class RunConfig(Section):
    """One asyncrl run: the merged result of a TOML file, its `extends` chain and `--set` overrides."""

    name: str = "run"
    """Run name: the controller's actor name and the default run directory."""
    description: str = ""
    """One line shown by `asyncrl presets list`."""
    extends: list[str] = []
    """Presets or files this one builds on (consumed by the loader; kept for provenance)."""
    model: ModelConfig
    """The policy model."""
    data: DataConfig
    """Prompts, lengths and reward."""
    resources: ResourcesConfig = Field(default_factory=ResourcesConfig)
    """Hardware and the trainer/rollout pools."""
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    """The policy update."""
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    """Generation."""
    async_training: AsyncTrainingConfig = Field(default_factory=AsyncTrainingConfig)
    """Asynchrony and staleness."""
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    """Advantages and rollout correction."""
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    """Checkpoints."""
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    """Run directory and sinks."""
    debug: DebugConfig = Field(default_factory=DebugConfig)
    """Fault injection."""

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError("name must start with a letter or digit and use only letters, digits, . _ -")
        return v
