"""The run-config schema: pydantic v2 models, one per TOML table.

Names follow verl where verl has the concept, so a verl script maps one to one (`asyncrl import verl`).
Every model forbids unknown keys, and every field has an attribute docstring: it becomes the field's
description in the JSON Schema (`asyncrl schema`) and in CLI help. Knobs the running controller may change
are the knob table's (`engine.runtime.knobs.KNOB_SPECS`, each with its `config_path`);
`schema_paths.runtime_knobs()` lists their fields, and the JSON Schema marks those, and only those,
`x-runtime-mutable`.

Single-field formats (ranges, enumerations, verl's rollout-correction spec strings) are validated here;
rules that relate several fields live in `checks.py`, where they can name file and line.

This module must stay importable without torch, ray, vllm or transformers.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from asyncrl_cli.config.names import BUILTIN_DATASETS, BUILTIN_MODELS, NAMED_REWARDS
from asyncrl_cli.config.rc_options import parse_is_threshold, parse_rs_options, parse_rs_thresholds

SCHEMA_VERSION = 1
"""Bumped when a key is renamed or removed (no aliases are kept: the old spelling fails loudly)."""



_REWARD_FN = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class Section(BaseModel):
    """Base of every table: unknown keys are errors, docstrings are descriptions."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_assignment=True,
                              allow_inf_nan=False)


class ModelConfig(Section):
    """The policy model (`[model]`)."""

    path: str
    """Local Hugging Face directory, hub id (read offline from the HF cache), or `builtin:tiny-qwen` /
    `builtin:smollm2`. `${ENV:-default}` expansion works here as in every string."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Parameter and compute dtype of the trainer, and of the rollout unless `rollout.dtype` says otherwise
    (mixed precision keeps fp32 master weights)."""
    tokenizer_path: str | None = None
    """Tokenizer directory or hub id when it differs from `path`."""
    trust_remote_code: bool = False
    """Allow the model's own Python code from its directory (as in transformers)."""

    @field_validator("path")
    @classmethod
    def _builtin_known(cls, v: str) -> str:
        if v.startswith("builtin:") and v.removeprefix("builtin:") not in BUILTIN_MODELS:
            raise ValueError(f"unknown built-in model {v!r}; choose one of {', '.join(BUILTIN_MODELS)}")
        if not v.strip():
            raise ValueError("model path is empty")
        return v


class DataConfig(Section):
    """Prompts, lengths and the reward (`[data]`)."""

    train_files: list[str] = Field(min_length=1)
    """Training parquet files in verl's row layout, or one `builtin:NAME` (copy, reverse, arith)."""
    val_files: list[str] = []
    """Validation parquet files (or `builtin:NAME`); empty = no validation."""
    max_prompt_length: int = Field(512, gt=0)
    """Longest prompt in tokens; longer prompts are filtered (see `filter_overlong_prompts`)."""
    max_response_length: int = Field(512, gt=0)
    """Generation budget per response in tokens (a resumed partial rollout keeps the remaining budget)."""
    reward: str = "auto"
    """Named reward (`gsm8k`, `math`, `geo3k`, `copy`, `reverse`, `arith`), `module:function`, or `auto`
    (chosen per row by its `data_source`)."""
    prompt_key: str = "prompt"
    """Column that holds the chat-format prompt."""
    image_key: str | None = None
    """Column that holds the images of a multimodal prompt (verl's `data.image_key`, e.g. `images`)."""
    filter_overlong_prompts: bool = True
    """Drop prompts longer than `max_prompt_length` instead of failing."""
    shuffle: bool = True
    """Shuffle the training prompts each epoch."""
    seed: int = 0
    """Seed of the shuffle and of built-in dataset generation."""
    train_size: int | None = Field(None, gt=0)
    """Rows of a built-in training set (None = the task's default size)."""
    val_size: int | None = Field(None, gt=0)
    """Rows of a built-in validation set (None = the task's default size)."""
    val_max_samples: int | None = Field(None, gt=0)
    """Validate on at most this many prompts (None = all)."""

    @field_validator("train_files", "val_files")
    @classmethod
    def _files(cls, v: list[str]) -> list[str]:
        builtin = [f for f in v if f.startswith("builtin:")]
        for f in builtin:
            if f.removeprefix("builtin:") not in BUILTIN_DATASETS:
                raise ValueError(
                    f"unknown built-in dataset {f!r}; choose one of {', '.join(BUILTIN_DATASETS)}"
                )
        if builtin and len(v) > 1:
            raise ValueError("a builtin: dataset cannot be mixed with other files")
        return v

    @field_validator("reward")
    @classmethod
    def _reward(cls, v: str) -> str:
        if v in NAMED_REWARDS or _REWARD_FN.match(v):
            return v
        raise ValueError(f"reward {v!r} is neither one of {', '.join(NAMED_REWARDS)} nor `module:function`")


class NodeGroup(Section):
    """A pool of nodes for one role."""

    nnodes: int = Field(1, gt=0)
    """Number of nodes (verl's `n_nodes_train` / `n_nodes_rollout`)."""
    gpus_per_node: int = Field(1, gt=0)
    """Accelerators used per node (verl's `n_gpus_training` / `n_gpus_rollout`); at most the hardware's
    `gpus_per_node`. On `device = "cpu"` hardware these are worker processes."""
    cpu_threads: int | Literal["all"] = 0
    """On `device = "cpu"` hardware: intra-op threads of each worker of this pool. 0 = automatic — fully async:
    the replicas share half the cores and the trainer ranks the rest (no oversubscription); sync: every core.
    "all" = every core. Oversubscribing is safe (OpenMP threads wait passively), and pays off for a trainer
    when the rollouter idles most of the time (a model whose update is much slower than its generation)."""

    @field_validator("cpu_threads")
    @classmethod
    def _threads(cls, v: int | str) -> int | str:
        if isinstance(v, int) and v < 0:
            raise ValueError("cpu_threads must be 0 (automatic), a positive number of threads, or \"all\"")
        return v


class ResourcesConfig(Section):
    """Where the run goes (`[resources]`): separate pools for trainer and rollout, as in verl fully async."""

    hardware: str = "cpu"
    """Name of a `presets/hardware/*.toml` preset (or a path to one)."""
    trainer: NodeGroup = Field(default_factory=NodeGroup)
    """Trainer pool (`trainer.nnodes`, `trainer.n_gpus_per_node` in verl)."""
    rollout: NodeGroup = Field(default_factory=NodeGroup)
    """Rollout pool (`rollout.nnodes`, `rollout.n_gpus_per_node` in verl)."""
    placement_timeout_s: float = Field(300.0, gt=0)
    """On accelerator hardware: how long `launch` waits for Ray to place the pools' placement groups (one per
    node, one bundle per accelerator) before it fails with one line naming what could not be placed."""


class OptimConfig(Section):
    """Optimizer of the policy (`[trainer.optim]`)."""

    name: Literal["adamw"] = "adamw"
    """Optimizer (AdamW with decoupled weight decay)."""
    lr: float = Field(1e-6, gt=0, lt=1, strict=True)
    """Learning rate after warm-up (constant schedule)."""
    betas: list[float] = Field([0.9, 0.999], min_length=2, max_length=2)
    """Adam β1, β2."""
    weight_decay: float = Field(0.01, ge=0)
    """Decoupled weight decay."""
    eps: float = Field(1e-8, gt=0)
    """Adam ε."""
    warmup_steps: int = Field(0, ge=0)
    """Linear warm-up over this many local steps."""

    @field_validator("betas")
    @classmethod
    def _betas(cls, v: list[float]) -> list[float]:
        if not all(0.0 <= b < 1.0 for b in v):
            raise ValueError("each beta must be in [0, 1)")
        return v


class TrainerConfig(Section):
    """The policy update (`[trainer]`; verl's `actor_rollout_ref.actor.*` and `trainer.*`)."""

    backend: Literal["torch", "megatron"] = "torch"
    """`torch` = FSDP2 data parallel (CPU gloo or GPU); `megatron` = Megatron-core with tp/pp/cp/ep."""
    tp: int = Field(1, gt=0)
    """Tensor parallel size (megatron)."""
    pp: int = Field(1, gt=0)
    """Pipeline parallel size (megatron)."""
    cp: int = Field(1, gt=0)
    """Context parallel size (megatron)."""
    ep: int = Field(1, gt=0)
    """Expert parallel size (megatron, MoE models)."""
    optim: OptimConfig = Field(default_factory=OptimConfig)
    """Optimizer settings."""
    grad_clip: float = Field(1.0, gt=0)
    """Clip the global gradient norm to this value."""
    ppo_mini_batch_size: int = Field(32, gt=0)
    """Prompts per mini-batch (each with `rollout.n` responses), as in verl: a local step trains on
    `async_training.require_batches` mini-batches, one optimizer step each, `ppo_epochs` times over."""
    ppo_micro_batch_size_per_gpu: int = Field(8, gt=0)
    """Sequences per forward/backward on one GPU (gradient accumulation splits the mini-batch)."""
    ppo_epochs: int = Field(1, gt=0, le=1000)
    """Passes over the local step's mini-batches (verl's key): optimizer steps per local step =
    `require_batches × ppo_epochs`; every pass takes its PPO ratio against the same π_old."""
    shuffle: bool = False
    """Permute the rows anew before each PPO epoch (seeded by `seed`); False = the same consecutive
    mini-batches every epoch (verl's `actor.shuffle`, default false)."""
    clip_ratio_low: float = Field(0.2, ge=0, lt=1)
    """PPO clip ε_low: ratio r is clipped to [1 − ε_low, 1 + ε_high]."""
    clip_ratio_high: float = Field(0.2, ge=0)
    """PPO clip ε_high (DAPO's clip-higher uses 0.28)."""
    clip_ratio_c: float = Field(3.0, gt=1)
    """Dual-clip constant c for A < 0: the loss is bounded by c·|A|."""
    loss_agg_mode: Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"] = "token-mean"
    """How per-token losses are aggregated into the batch loss (verl's names)."""
    use_kl_loss: bool = False
    """Add a KL(π_θ‖π_ref) penalty to the loss (needs a reference model)."""
    kl_loss_coef: float = Field(0.001, ge=0)
    """Weight of the KL loss."""
    kl_loss_type: Literal["low_var_kl", "k1", "k2"] = "low_var_kl"
    """KL estimator: k1 = log r, k2 = ½(log r)², low_var_kl = k3 = r − 1 − log r (clamped)."""
    entropy_coeff: float = Field(0.0, ge=0)
    """Entropy bonus weight (0 = off)."""
    total_steps: int | None = Field(None, gt=0)
    """Total policy versions to train (overrides the count derived from data and `total_rollout_steps`)."""
    total_epochs: int = Field(1, gt=0, le=100_000)
    """Passes over the training data."""
    test_freq: int = Field(0, ge=0)
    """Validate every N policy versions (0 = never)."""
    val_before_train: bool = False
    """Validate once before the first update."""
    skip_zero_advantage: bool = False
    """Opt-in speed-up: drop the rows of groups whose responses all got the same reward (GRPO advantage 0)
    before the update. They carry no policy gradient, but dropping them changes the loss: the token-mean (or
    seq-mean) denominator no longer counts their tokens, and their entropy and KL-loss terms are gone. verl
    keeps them (its group filtering is off by default), so False matches verl."""
    seed: int = 0
    """Seed of initialisation and sampling on the trainer."""
    deterministic: bool = False
    """Bit-reproducible run (CPU, fp32, one `hf` replica): sampling keyed by (seed, prompt uid, sample,
    position), each prompt generated alone, a schedule independent of timing, one thread per process; a run
    killed and resumed, or async at staleness 0 / trigger 1 vs `mode = "sync"`, ends with the same weights."""


class RolloutConfig(Section):
    """Generation (`[rollout]`; verl's `actor_rollout_ref.rollout.*`)."""

    backend: Literal["hf", "vllm"] = "hf"
    """`hf` = asyncrl's own sampler on transformers (CPU and small GPUs); `vllm` = vLLM replicas."""
    n: int = Field(8, gt=0, le=4096)
    """Responses per prompt (the GRPO group size)."""
    temperature: float = Field(1.0, ge=0)
    """Sampling temperature (the rollout log-probs are those of the sampling distribution)."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling mass (1.0 = off)."""
    top_k: int = Field(0, ge=0)
    """Top-k sampling (0 = off; verl's −1 for vLLM)."""
    tensor_parallel_size: int = Field(1, gt=0)
    """GPUs per rollout replica (vLLM tensor parallel)."""
    gpu_memory_utilization: float = Field(0.85, gt=0, le=1)
    """Fraction of each rollout GPU vLLM may take for weights plus KV cache."""
    max_num_seqs: int = Field(256, gt=0)
    """Concurrent sequences per replica."""
    dtype: Literal["fp32", "bf16"] | None = None
    """Weights and compute precision of the rollout replicas, set apart from the trainer's `model.dtype`
    (None = the same). Synced weights are cast on load; a bf16 rollout against an fp32 trainer is a
    train–inference mismatch (per-token ratios ~0.6–1.5): pair it with rollout correction."""
    total_rollout_steps: int | None = Field(None, gt=0)
    """Total prompts to generate (verl's name; None = the whole data × `trainer.total_epochs`)."""
    val_temperature: float = Field(0.0, ge=0)
    """Temperature of validation generation (0 = greedy)."""
    replicas: int | None = Field(None, gt=0)
    """Rollout replicas (None = rollout GPUs / `tensor_parallel_size`)."""
    weight_sync_bucket_mb: int = Field(512, gt=0)
    """Size of one weight-sync bucket in MiB."""
    weight_sync: Literal["object_store", "collective"] = "object_store"
    """How new weights reach the replicas: `object_store` (Ray's object store, one `ray.put` per bucket) or
    `collective` (trainer rank 0 broadcasts the buckets over a gloo group on CPU / NCCL on CUDA with the
    replicas, as it exports them; `hf` replicas only, and no replica restarts)."""
    max_replica_restarts: int = Field(3, ge=0)
    """Replacement replicas the rollouter may start over the whole run after replica processes die (their
    in-flight prompts are re-queued and the replacement gets the current weights). One failure more stops
    the run cleanly: a checkpoint, exit code 1 and a message; resume it with `--resume auto`."""


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
        from asyncrl_cli.config.rc_presets import RC_PRESETS, canonical_preset_name

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


class AlgorithmConfig(Section):
    """Advantage estimation and rollout correction (`[algorithm]`)."""

    adv_estimator: Literal["grpo"] = "grpo"
    """Advantage estimator: GRPO, A_i = (r_i − mean(r)) / (std(r) + ε) within each prompt's group."""
    norm_adv_by_std_in_grpo: bool = True
    """Divide by the group's reward std (False = Dr.GRPO, centring only)."""
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
