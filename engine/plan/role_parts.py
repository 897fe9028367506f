"""The typed parts of the role specs (`engine.plan.roles`): each computed once from the run config by the plan, and
carried by the roles that use them — an actor reads these and never the config.

    EngineSpec      a rollout replica's generation engine: backend, dtype (`rollout.dtype`, else `model.dtype`),
                    batch rows, vLLM's TP / memory share / context length, seed, determinism, back buffer
    BackendSpec     a trainer rank's backend: the precision policy (`engine.config.precision`, derived here once),
                    attention, the dtype the weights are exported in (the replicas'), the optimizer
                    (`OptimSpec`), the local step's batching (`UpdateSpec`), Megatron's layout (`MegatronSpec`)
    LossSpec        the GRPO loss (`engine.algo.loss.build_loss_fn`): clipping, aggregation, KL, entropy, and the
                    rollout-correction section
    BatchPrepSpec   the batch a local step trains on (`engine.algo.batching.prepare_batch`): advantages, the
                    loss's denominator, zero-advantage rows
    CheckpointSpec  where and how many checkpoints the trainer writes, and the config fingerprint they carry
    PromptSpec      the rollouter's prompts: the `[data]` table (`engine.data.prompts.load_prompts` reads it),
                    epochs, and whether (and how many) validation prompts are loaded
    ScoringSpec     the reward (`engine.runtime.scoring.Scorer`): the reward function, DAPO's overlong penalty
    FaultSpec       fault injection (`[debug]`): kill a replica or the trainer at a step

A value the launch decides ("auto" precision, dtype or attention: `engine.launch.probe.resolve_auto`) is carried
as it is until then (precision None, dtype None, attention "auto") and refused by the backend builders; the
driver builds the specs of the resolved plan. Pure Python (no torch, no Ray).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.config.precision import PrecisionPolicy, trainer_precision
from engine.types import SamplingParams

if TYPE_CHECKING:
    from engine.config.data_section import DataConfig
    from engine.config.schema import RolloutCorrectionConfig, RunConfig

ROLLOUT_DTYPES = {"fp32": "float32", "bf16": "bfloat16"}
"""`rollout.dtype` → torch dtype name."""


@dataclass(frozen=True)
class EngineSpec:
    """One rollout replica's engine (`engine.runtime.backends.build_rollout_backend`)."""

    backend: str
    """"hf" or "vllm"."""
    dtype: str | None
    """Torch dtype name the replica generates in (`rollout_dtype`); None: "auto", decided at launch."""
    max_num_seqs: int
    max_model_len: int
    """data.max_prompt_length + data.max_response_length (vLLM's context)."""
    tensor_parallel_size: int
    gpu_memory_utilization: float
    seed: int
    deterministic: bool
    """`trainer.deterministic`: one intra-op thread, batch-invariant generation."""
    back_buffer: str
    """`rollout.weight_sync_back_buffer`: "on", "off" or "auto"."""
    nodes: int = 1
    """Nodes one replica spans (`engine.plan.rollout_replica.replica_nodes`): > 1 runs one vLLM engine over that
    many nodes (`engine.runtime.replica_nodes`)."""
    quantization: str | None = None
    """`rollout.quantization`: "fp8" = a block-FP8 vLLM model (`engine.rollout.vllm.fp8_checkpoint`)."""
    pipeline_parallel_size: int = 1
    """`rollout.pipeline_model_parallel_size` (vLLM's `pipeline_parallel_size`)."""
    data_parallel_size: int = 1
    """`rollout.data_parallel_size`: vLLM engine cores inside the replica (vLLM's `data_parallel_size`)."""
    expert_parallel_size: int = 1
    """`rollout.expert_parallel_size`: > 1 spreads the routed experts over the replica's TP × DP workers (vLLM's
    `enable_expert_parallel`)."""

    @property
    def world(self) -> int:
        """The replica's worker processes: TP × PP × DP (`engine.plan.rollout_replica.replica_gpus`)."""
        return self.tensor_parallel_size * self.pipeline_parallel_size * self.data_parallel_size


@dataclass(frozen=True)
class OptimSpec:
    """AdamW (`[trainer.optim]`, `name` = "adamw": the only one) and the gradient clip."""

    lr: float
    betas: tuple[float, float]
    weight_decay: float
    eps: float
    warmup_steps: int

    def settings(self) -> dict[str, Any]:
        """The backends' `optim_cfg` mapping."""
        return asdict(self)


@dataclass(frozen=True)
class UpdateSpec:
    """How one local step is cut (verl's actor loop): `mini_batches` (async_training.require_batches) × `ppo_epochs`
    optimizer steps, each over micro-batches of `micro_batch_size` rows or, with `use_dynamic_bsz`, of token
    budgets."""

    mini_batches: int
    ppo_epochs: int
    shuffle: bool
    micro_batch_size: int
    use_dynamic_bsz: bool
    ppo_max_token_len_per_gpu: int
    log_prob_max_token_len_per_gpu: int | None
    logprob_chunk_tokens: int

    def settings(self) -> dict[str, Any]:
        """The backends' keyword arguments (`micro_batch_size` is `ppo_micro_batch_size_per_gpu`)."""
        return asdict(self)


@dataclass(frozen=True)
class MegatronSpec:
    """Megatron's model-parallel layout and recomputation (`trainer.backend = "megatron"`)."""

    tp: int
    pp: int
    cp: int
    ep: int
    etp: int
    recompute_granularity: str | None
    recompute_method: str
    recompute_num_layers: int
    perf: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The performance settings resolved per device type (`engine.plan.megatron_perf.perf_values`): the backend
    takes those of the device it is built on (a rehearsal builds a CUDA run's ranks on CPU stand-ins)."""
    model: dict[str, Any] = field(default_factory=dict)
    """The model settings of `engine.config.megatron_model` that are set (uneven pipeline stages, MoE auxiliary
    losses, dropout), by their `trainer.*` names: the backend's keyword arguments."""


@dataclass(frozen=True)
class BackendSpec:
    """A trainer rank's backend (`engine.runtime.backends.build_trainer_backend`)."""

    kind: str
    """`trainer.backend`: "torch" (one rank, or FSDP2 over M) or "megatron"."""
    precision: PrecisionPolicy | None
    """Parameters / compute / gradient reduction / optimizer dtypes; None: "auto", decided at launch."""
    attn_implementation: str
    """"sdpa" or "eager" ("auto": decided at launch)."""
    export_dtype: str | None
    """The dtype the weights are synced in: the replicas' (`EngineSpec.dtype`)."""
    optim: OptimSpec
    grad_clip: float
    update: UpdateSpec
    temperature: float
    """The rollout's sampling temperature (1 for greedy): the trainer's log-probs are under it."""
    seed: int
    deterministic: bool
    gradient_checkpointing: bool
    shared_prompt: bool
    ref_param_offload: bool
    megatron: MegatronSpec
    use_remove_padding: bool = False
    """Packed rows (`engine.trainer.packed_rows`): the rows of a micro-batch forwarded without padding."""
    ulysses_sequence_parallel_size: int = 1
    """Ulysses SP group size of the torch/FSDP2 trainer (`engine.trainer.ulysses`; policy and reference alike)."""


@dataclass(frozen=True)
class LossSpec:
    """The loss of `engine.algo.loss.build_loss_fn` (its `trainer_cfg` fields) and the rollout correction."""

    loss_agg_mode: str
    loss_mode: str
    """"vanilla" (PPO-clip), "gspo" or "geo_mean" (`engine.algo.seq_policy_loss`)."""
    clip_ratio_low: float
    clip_ratio_high: float
    clip_ratio_c: float
    use_kl_loss: bool
    """Also: the trainer builds the frozen reference (`build_reference_backend`)."""
    kl_loss_coef: float
    kl_loss_type: str
    entropy_coeff: float
    rollout_correction: RolloutCorrectionConfig
    """`[algorithm.rollout_correction]` as validated (its parsers live with the section)."""


@dataclass(frozen=True)
class BatchPrepSpec:
    """`engine.algo.batching.prepare_batch`'s settings."""

    loss_agg_mode: str
    norm_adv_by_std: bool
    skip_zero_advantage: bool


@dataclass(frozen=True)
class CheckpointSpec:
    """The trainer's checkpoints (`engine.persist.trainer_checkpoints`)."""

    dir: str | None
    """`checkpoint.dir` (None: `<run dir>/checkpoints`)."""
    keep_last: int
    fingerprint: dict[str, Any]
    """`engine.persist.resume.config_fingerprint`: the settings a checkpoint is only valid with."""

    def root(self, run_dir: str | Path) -> Path:
        from engine.persist.checkpoint import checkpoint_dir

        return checkpoint_dir(self.dir, run_dir)


@dataclass(frozen=True)
class PromptSpec:
    """The rollouter's prompt sources."""

    data: DataConfig
    """The `[data]` table, as `engine.data.prompts.load_prompts` reads it (files, keys, lengths, shuffling)."""
    total_epochs: int
    validate: bool
    """Validation prompts are loaded: `data.val_files` and (`trainer.test_freq` > 0 or `val_before_train`)."""
    val_before_train: bool
    val_max_samples: int | None


@dataclass(frozen=True)
class OverlongSpec:
    """DAPO's overlong buffer (`data.overlong_buffer`, on with `reward_manager = "dapo"`)."""

    len: int
    penalty_factor: float
    log: bool


@dataclass(frozen=True)
class ScoringSpec:
    """`engine.runtime.scoring.Scorer`'s reward."""

    reward: str
    max_response_length: int
    overlong: OverlongSpec | None = None


@dataclass(frozen=True)
class FaultSpec:
    """Fault injection (`[debug]`; 0 = off)."""

    kill_replica_at_step: int = 0
    kill_trainer_at_step: int = 0
    kill_replica_mid_sync_file: str | None = None
    """When this file exists, the replica receiving a sync deletes it and dies after the first bucket."""
    stop_at_step: int = 0
    """A graceful stop at the boundary after this local step (once per launch)."""


def rollout_dtype(cfg: RunConfig) -> str | None:
    """The rollout's torch dtype name: `rollout.dtype` when set, else `model.dtype`; None for "auto"."""
    chosen = cfg.rollout.dtype
    if chosen == "auto":
        return None
    return ROLLOUT_DTYPES[chosen] if chosen else cfg.model.dtype


def precision_of(cfg: RunConfig) -> PrecisionPolicy | None:
    """The trainer's precision policy (`engine.config.precision.trainer_precision`); None for "auto"."""
    if cfg.trainer.precision == "auto":
        return None
    return trainer_precision(cfg.trainer, cfg.model.dtype)


def engine_spec(cfg: RunConfig) -> EngineSpec:
    from engine.plan.rollout_replica import replica_nodes

    ro, d = cfg.rollout, cfg.data
    return EngineSpec(ro.backend, rollout_dtype(cfg), ro.max_num_seqs, d.max_prompt_length + d.max_response_length,
                      ro.tensor_parallel_size, ro.gpu_memory_utilization, cfg.trainer.seed, cfg.trainer.deterministic,
                      ro.weight_sync_back_buffer, replica_nodes(cfg, cfg.resources.rollout.gpus_per_node),
                      ro.quantization, ro.pipeline_model_parallel_size, ro.data_parallel_size,
                      ro.expert_parallel_size)


PERF_DEVICES = ("cuda", "npu", "cpu")
"""The device types Megatron's performance settings are resolved for (`MegatronSpec.perf`)."""


def megatron_model_settings(cfg: RunConfig) -> dict[str, Any]:
    """`MegatronSpec.model`: the `engine.config.megatron_model` keys of `cfg.trainer` that are not at their
    default."""
    from engine.config.megatron_model import MegatronModelConfig

    t = cfg.trainer
    return {name: getattr(t, name) for name, f in MegatronModelConfig.model_fields.items()
            if getattr(t, name) != f.default}


def backend_spec(cfg: RunConfig) -> BackendSpec:
    """The trainer backend's part of the trainer spec."""
    from engine.plan.megatron_perf import perf_values

    t, o = cfg.trainer, cfg.trainer.optim
    update = UpdateSpec(cfg.async_training.require_batches, t.ppo_epochs, t.shuffle, t.ppo_micro_batch_size_per_gpu,
                        t.use_dynamic_bsz, t.ppo_max_token_len_per_gpu, t.log_prob_max_token_len_per_gpu,
                        t.logprob_chunk_tokens)
    megatron = MegatronSpec(t.tp, t.pp, t.cp, t.ep, t.etp, t.recompute_granularity, t.recompute_method,
                            t.recompute_num_layers,
                            {d: perf_values(cfg, d) for d in PERF_DEVICES} if t.backend == "megatron" else {},
                            megatron_model_settings(cfg))
    return BackendSpec(
        kind=t.backend, precision=precision_of(cfg), attn_implementation=t.attn_implementation,
        export_dtype=rollout_dtype(cfg),
        optim=OptimSpec(o.lr, (float(o.betas[0]), float(o.betas[1])), o.weight_decay, o.eps, o.warmup_steps),
        grad_clip=t.grad_clip, update=update,
        temperature=cfg.rollout.temperature if cfg.rollout.temperature > 0 else 1.0, seed=t.seed,
        deterministic=t.deterministic, gradient_checkpointing=t.enable_gradient_checkpointing,
        shared_prompt=t.shared_prompt, ref_param_offload=t.ref_param_offload, megatron=megatron,
        use_remove_padding=t.use_remove_padding, ulysses_sequence_parallel_size=t.ulysses_sequence_parallel_size)


def loss_spec(cfg: RunConfig) -> LossSpec:
    t = cfg.trainer
    return LossSpec(t.loss_agg_mode, t.loss_mode, t.clip_ratio_low, t.clip_ratio_high, t.clip_ratio_c, t.use_kl_loss,
                    t.kl_loss_coef, t.kl_loss_type, t.entropy_coeff, cfg.algorithm.rollout_correction)


def batch_prep_spec(cfg: RunConfig) -> BatchPrepSpec:
    from engine.config.loss_mode import effective_agg_mode

    return BatchPrepSpec(effective_agg_mode(cfg.trainer), cfg.algorithm.norm_adv_by_std_in_grpo,
                         cfg.trainer.skip_zero_advantage)


def checkpoint_spec(cfg: RunConfig) -> CheckpointSpec:
    from engine.persist.resume import config_fingerprint

    return CheckpointSpec(cfg.checkpoint.dir, cfg.checkpoint.keep_last, config_fingerprint(cfg))


def prompt_spec(cfg: RunConfig) -> PromptSpec:
    t, d = cfg.trainer, cfg.data
    return PromptSpec(d, t.total_epochs, bool(d.val_files) and (t.test_freq > 0 or t.val_before_train),
                      t.val_before_train, d.val_max_samples)


def scoring_spec(data: DataConfig) -> ScoringSpec:
    """The reward of a `[data]` table."""
    ob = data.overlong_buffer
    overlong = OverlongSpec(ob.len, ob.penalty_factor, ob.log) if data.reward_manager == "dapo" and ob.enable else None
    return ScoringSpec(data.reward, data.max_response_length, overlong)


def sampling_of(cfg: RunConfig, validation: bool = False) -> SamplingParams:
    """The training (or validation) sampling distribution of the replicas."""
    ro = cfg.rollout
    if validation:
        return SamplingParams(ro.val_temperature, ro.val_top_p, ro.val_top_k, cfg.trainer.seed)
    return SamplingParams(ro.temperature, ro.top_p, ro.top_k, cfg.trainer.seed)


def fault_spec(cfg: RunConfig) -> FaultSpec:
    dbg = cfg.debug
    return FaultSpec(dbg.kill_replica_at_step or 0, dbg.kill_trainer_at_step or 0,
                     dbg.kill_replica_mid_sync_file or None, dbg.stop_at_step or 0)
