"""The run-config schema's sections for the model, resources, optimizer, trainer and rollout (pydantic v2,
one model per TOML table; the data table is `engine.config.data_section`'s, re-exported here);
`engine.config.schema` has the asynchrony, algorithm, checkpoint, logging and debug sections and `RunConfig`
itself.

Every model forbids unknown keys, and every field has an attribute docstring: it becomes the field's
description in the JSON Schema (`asyncrl schema`) and in CLI help. Names follow verl where verl has the
concept. Pure Python + pydantic: no torch, ray, vllm or transformers.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from engine.config.data_section import DataConfig as DataConfig
from engine.config.data_section import OverlongBufferConfig as OverlongBufferConfig
from engine.config.megatron_model import MegatronModelConfig
from engine.config.megatron_perf import MegatronPerfConfig
from engine.config.multi_turn import MultiTurnConfig
from engine.config.names import BUILTIN_MODELS
from engine.config.section import Section as Section


class ModelConfig(Section):
    """The policy model (`[model]`)."""

    path: str
    """Local Hugging Face directory, hub id (read offline from the HF cache), or `builtin:tiny-qwen` /
    `builtin:smollm2`. `${ENV:-default}` expansion works here as in every string."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """The model's *compute* dtype: the default precision of the trainer's forward/backward (unless
    `trainer.precision` says otherwise) and of the rollout (unless `rollout.dtype` says otherwise), as verl's
    `model_dtype`. It is not the dtype of the trainer's parameters: those, the gradient reduction and the
    optimizer state stay fp32 master weights (`trainer.fp32_master_weights`), so `bfloat16` here means bf16
    compute over fp32 masters — verl's FSDP2 `MixedPrecisionPolicy` and Megatron's fp32 main params."""
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


class NodeGroup(Section):
    """A pool of nodes for one role."""

    nnodes: int = Field(1, gt=0)
    """Number of nodes (verl's `n_nodes_train` / `n_nodes_rollout`)."""
    gpus_per_node: int = Field(1, gt=0)
    """Accelerators used per node (verl's `n_gpus_training` / `n_gpus_rollout`); at most the hardware's
    `gpus_per_node`. On `device = "cpu"` hardware these are worker processes."""
    cpu_threads: int | Literal["all", "auto"] = 0
    """On `device = "cpu"` hardware: intra-op threads of each worker of this pool. 0 = automatic — fully async:
    the replicas share half the cores and the trainer ranks the rest (no oversubscription); sync: every core.
    "all" = every core. Oversubscribing is safe (OpenMP threads wait passively), and pays off for a trainer
    when the rollouter idles most of the time (a model whose update is much slower than its generation).
    "auto" = measured at launch: every core when this pool's matmuls run ≥ 1.25× faster on every core than on
    one, else the automatic split (`engine.plan.auto`; cached per machine, reported at launch)."""

    @field_validator("cpu_threads")
    @classmethod
    def _threads(cls, v: int | str) -> int | str:
        if isinstance(v, int) and v < 0:
            raise ValueError("cpu_threads must be 0 (automatic), a positive number of threads, \"all\" or \"auto\"")
        return v


class ResourcesConfig(Section):
    """Where the run goes (`[resources]`): separate pools for trainer and rollout, as in verl fully async."""

    hardware: str = "cpu"
    """Name of a `presets/hardware/*.toml` preset (or a path to one)."""
    trainer: NodeGroup = Field(default_factory=NodeGroup)
    """Trainer pool (`trainer.nnodes`, `trainer.n_gpus_per_node` in verl)."""
    rollout: NodeGroup = Field(default_factory=NodeGroup)
    """Rollout pool (`rollout.nnodes`, `rollout.n_gpus_per_node` in verl)."""
    elastic_cores: bool = False
    """On `device = "cpu"`, fully async, one trainer rank, not `trainer.deterministic`: when one role waits (the
    trainer for a batch; the rollout for the staleness budget, a sync or the end of the stream), the other takes
    its threads, and gives them back before the waiting role computes again (`engine.loop.elastic`: the trainer
    changes its threads at a local-step boundary, a replica at a decode step). Off by default: on the tiny
    preset it measured within the spread of the fixed split (docs/benchmarks.md, "Elastic cores"). Elsewhere
    it changes nothing (`asyncrl plan` models the GPU analogue, lending idle trainer devices to rollout)."""
    placement_timeout_s: float = Field(300.0, gt=0)
    """On accelerator hardware: how long `launch` waits for Ray to place the pools' placement groups (one per
    node, one bundle per accelerator) before it fails with one line naming what could not be placed."""
    stop_grace_s: float | None = Field(None, gt=0)
    """Seconds between a stop signal (SIGTERM, SIGINT, SIGHUP) and the SIGKILL that follows it (a scheduler's
    grace period: Slurm `KillWait`, Kubernetes `terminationGracePeriodSeconds`, both 30 s by default). The stop
    then writes the full checkpoint if it fits, else a light one (the prompt stream's position, queue and
    in-flight prompts with the weights of the last full checkpoint), and says which. Unset: the environment
    variable `ASYNCRL_STOP_GRACE_S`, else no deadline (always the full checkpoint)."""
    collective_env: dict[str, str] = Field(default_factory=dict)
    """Environment of every trainer rank and rollout replica for their collectives (e.g. `NCCL_SOCKET_IFNAME`,
    `HCCL_CONNECT_TIMEOUT`, `GLOO_SOCKET_IFNAME`): over the hardware preset's `collective_env` and the launching
    shell's `NCCL_*` / `HCCL_*` / `GLOO_SOCKET_IFNAME` variables."""


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


class TrainerConfig(MegatronPerfConfig, MegatronModelConfig):
    """The policy update (`[trainer]`; verl's `actor_rollout_ref.actor.*` and `trainer.*`; the Megatron
    performance settings are `engine.config.megatron_perf`'s, its model settings — uneven pipeline stages, MoE
    auxiliary losses, dropout, the reference's layout — `engine.config.megatron_model`'s)."""

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
    precision: Literal["fp32", "bf16", "auto"] | None = None
    """Compute precision of the trainer's forward and backward, overriding `model.dtype` (None = from
    `model.dtype`). Below fp32 the matmuls run in bf16 (AMX / AVX-512-BF16 on CPU, tensor cores on GPU) —
    single rank: `torch.autocast` over fp32 parameters; FSDP2: `MixedPrecisionPolicy(param_dtype=bf16,
    reduce_dtype=fp32)` over fp32 shards; Megatron: bf16 params with fp32 main params in the optimizer —
    while log-softmax, the loss, the gradient reduction and the update stay fp32 (see `fp32_master_weights`).
    `launch --dry-run` prints the resulting policy. `auto` = decided at launch: bf16 on cuda / npu; on CPU
    bf16 when it times ≥ 1.1× faster than fp32 at the trainer's matmul and LM-head shapes on this machine, else
    fp32 (`engine.plan.auto`; cached per machine and shape, reported at launch, recorded in
    `<run dir>/machine.json`)."""
    fp32_master_weights: bool = True
    """Keep the trainer's parameters, gradient reduction and optimizer state in fp32 whatever the compute
    dtype (verl and Megatron always do). False = a pure compute-dtype trainer: with bf16 compute the AdamW
    update is rounded to bf16, and at lr ≈ 1e-6 most weights never move (`validate` warns)."""
    ref_param_offload: bool = False
    """Keep the frozen reference model's weights in host memory between its log-prob calls and move them to
    the device only for them (verl's `ref.param_offload`). The reference never has gradients, an optimizer or
    a DDP wrapper in any case."""
    ulysses_sequence_parallel_size: int = Field(1, gt=0)
    """torch / FSDP2 backend: Ulysses sequence parallelism (verl's key, for the actor and the reference alike).
    Groups of s consecutive trainer ranks share their rows and split each row's positions; an all-to-all
    around attention gives each rank the full sequence for H/s of the heads (`engine.trainer.ulysses`). The
    data-parallel size is ranks / s, and the token budgets (`ppo_max_token_len_per_gpu`, …) count per GPU as in
    verl: an SP group takes micro-batches of budget × s tokens. s must divide the ranks and the attention
    heads, and divide or be a multiple of the KV heads; eager / sdpa attention. The megatron backend splits
    sequences with `cp` instead."""
    attn_implementation: Literal["sdpa", "eager", "auto"] = "sdpa"
    """torch / FSDP2 backends: the attention kernel of the trainer's model (transformers' `attn_implementation`;
    verl's `model.override_config.attn_implementation`). `sdpa` = `scaled_dot_product_attention` (transformers'
    default; flash-style, memory O(S)); `eager` = softmax(QKᵀ/√d + mask)·V in plain matmuls, which keeps the
    B·H·S² probabilities for the backward. On CPU the flash kernel's backward works in fixed blocks, so at short
    rows (a few hundred tokens) eager's fwd + bwd can be several times faster — and at long rows several times
    slower. `auto` = decided at launch: `sdpa` on cuda / npu; on CPU the faster of the two, timed fwd + bwd at
    the trainer's micro-batch rows × (max_prompt_length / 2 + max_response_length) positions in its precision
    (`eager` when ≥ 1.1× faster; `engine.plan.auto`, cached per machine and shape, reported at launch). The
    megatron backend has its own attention and ignores this key (`validate` warns when it is set there)."""
    enable_gradient_checkpointing: bool = False
    """torch / FSDP2 backends: recompute each decoder layer's activations in the backward pass instead of
    keeping them (HF's `gradient_checkpointing_enable()`, verl's `model.enable_gradient_checkpointing`)."""
    recompute_granularity: Literal["full", "selective"] | None = None
    """megatron backend: activation recompute (Megatron's `recompute_granularity`): `full` = whole
    transformer layers (see `recompute_method`), `selective` = core attention only; None = off."""
    recompute_method: Literal["uniform", "block"] = "uniform"
    """megatron, `recompute_granularity = "full"`: `uniform` recomputes groups of `recompute_num_layers`
    layers, `block` the first `recompute_num_layers` layers of each pipeline stage (Megatron's meaning)."""
    recompute_num_layers: int = Field(1, gt=0)
    """megatron, full recompute: layers per recompute group (uniform) or recomputed layers per stage (block)."""
    etp: int = Field(1, gt=0)
    """Expert tensor parallel size of Megatron MoE layers (`expert_tensor_parallel_size`; verl's default 1):
    experts are split etp × ep ways, and etp × ep must divide tp × cp × dp."""
    logprob_chunk_tokens: int = Field(4096, gt=0)
    """Response tokens per chunk of the log-prob / entropy head: torch / FSDP2 run the output projection,
    log-softmax and entropy chunk by chunk (recomputed in backward), so at most [chunk × vocab] logits exist at
    once instead of [tokens × vocab]; Megatron chunks the fp32 log-softmax over its vocab-parallel logits.
    The entropy is computed only when a loss uses it or `actor/entropy` is logged."""
    shared_prompt: bool = True
    """torch / FSDP2 backends: forward the rows of a micro-batch that share a prompt (a GRPO group's n responses)
    as one sequence — the prompt once, each response attending to it and to itself only, at the positions it
    had — instead of n padded rows. The log-probs, entropy and gradient are the padded forward's (up to
    summation order); the linear layers see |p| + Σ|r_i| tokens instead of n·|p| + Σ|r_i| (~2.7× fewer on the
    demo). Applies with `eager` / `sdpa` attention to text models, when it saves ≥ 1.1× the tokens and the
    dense mask fits 64 MiB (`engine.trainer.shared_prefix`); the metric `asyncrl/trainer/shared_prompt_saving`
    reports the saving. The megatron backend forwards padded rows. On an accelerator sdpa with a dense mask
    cannot take the flash kernel; no GPU run has measured whether sharing still pays there (the shipped GPU
    presets do not share: their rows are too long for the mask, or carry images)."""
    use_remove_padding: bool = True
    """torch / FSDP2 backends: forward a micro-batch's rows without their padding (verl's
    `actor_rollout_ref.model.use_remove_padding`): the rows' real tokens concatenated, position ids restarting
    per row, attention kept within a row — one varlen sequence under a flash-attention implementation on CUDA,
    else first-fit sequences of the longest row's width under a block-diagonal mask (`eager` / `sdpa`, e.g. on
    CPU; never more tokens or attention scores than the padded rows). The log-probs and gradient are the padded
    forward's (up to summation order); with `shared_prompt` the one of the two packings that forwards fewer
    tokens runs (`engine.trainer.packed_rows`). With `use_dynamic_bsz` the token budgets then count the packed
    tokens (the real tokens on the varlen layout, plus the first-fit slack on the masked one) instead of rows ×
    longest row. Text rows only (rows with images are forwarded padded); the megatron backend forwards padded
    rows."""
    grad_clip: float = Field(1.0, gt=0)
    """Clip the global gradient norm to this value."""
    ppo_mini_batch_size: int = Field(32, gt=0)
    """Prompts per mini-batch (each with `rollout.n` responses), as in verl: a local step trains on
    `async_training.require_batches` mini-batches, one optimizer step each, `ppo_epochs` times over."""
    ppo_micro_batch_size_per_gpu: int = Field(8, gt=0)
    """Sequences per forward/backward on one GPU (gradient accumulation splits the mini-batch)."""
    use_dynamic_bsz: bool = False
    """Token-budget micro-batches (verl's key): instead of `ppo_micro_batch_size_per_gpu` rows, each rank groups
    its rows into micro-batches of at most `ppo_max_token_len_per_gpu` padded tokens (rows × the micro-batch's
    longest row, prompt + response: rows of similar length grouped together, the ranks agreeing on one count;
    `log_prob_max_token_len_per_gpu` for the log-prob passes), each padded only to its own longest row. The
    gradient equals the unsplit one for every `loss_agg_mode`. torch and megatron backends (with pp > 1 each
    micro-batch passes the pipeline with its own shape; a MoE model under Megatron's all-gather dispatcher pads
    them to one, `engine.trainer.megatron.pipeline`)."""
    ppo_max_token_len_per_gpu: int = Field(16384, gt=0)
    """Padded tokens (rows × longest row) per update micro-batch and rank with `use_dynamic_bsz` (verl's key;
    ≥ the longest row)."""
    log_prob_max_token_len_per_gpu: int | None = Field(None, gt=0)
    """Tokens per micro-batch of the no-grad log-prob passes (π_old, π_prox, reference) with `use_dynamic_bsz`
    (verl's key); None = `ppo_max_token_len_per_gpu`."""
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
    loss_mode: Literal["vanilla", "gspo", "geo_mean"] = "vanilla"
    """Policy loss (verl's `actor.policy_loss.loss_mode`): `vanilla` = PPO-clip with dual-clip; `gspo` = GSPO's
    sequence-level ratio (arXiv 2507.18071); `geo_mean` = GMPO, the geometric mean of the token ratios clipped in
    log space (arXiv 2507.20673). Both sequence modes use the clip range, ignore `clip_ratio_c`, and aggregate
    per sequence (seq-mean-token-mean) whatever `loss_agg_mode` says; with `use_kl_loss` or an entropy bonus they
    require `loss_agg_mode = "seq-mean-token-mean"` (`engine.config.loss_mode`)."""
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

    @model_validator(mode="after")
    def _loss_mode(self) -> TrainerConfig:
        from engine.config.loss_mode import loss_mode_error

        problem = loss_mode_error(self)
        if problem is not None:
            raise ValueError(problem)
        return self


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
    """Tensor parallel size of a rollout replica (vLLM's; verl's `tensor_model_parallel_size`). A replica has
    tensor_parallel_size × pipeline_model_parallel_size × data_parallel_size GPUs
    (`engine.plan.rollout_replica`)."""
    pipeline_model_parallel_size: int = Field(1, gt=0)
    """vLLM pipeline stages of a replica (verl's name): the layers split into stages, e.g. one per node for a
    dense model too large for one node."""
    data_parallel_size: int = Field(1, gt=0)
    """vLLM data-parallel attention ranks inside a replica (verl's name), each with its own requests, KV cache and
    `max_num_seqs`; with `expert_parallel_size` the MoE experts are spread over all of them."""
    expert_parallel_size: int = Field(1, gt=0)
    """vLLM expert parallelism (verl's name; vLLM's `enable_expert_parallel`): the routed experts are spread over
    the replica's tensor_parallel_size × data_parallel_size ranks (verl requires that product), so a MoE replica
    can span nodes with a slice of the experts per GPU. 1 = the experts are split tensor-parallel."""
    quantization: Literal["fp8"] | None = None
    """Rollout weights' format (verl's `rollout.quantization`): `fp8` = the decoder layers' linear weights as
    float8 e4m3 with one fp32 scale per 128 × 128 block (DeepSeek-V3's released layout), quantised per bucket by the
    weight sync's sender; the embedding, LM head, norms and routers in `rollout.dtype`; the trainer keeps its
    precision, so pair it with rollout correction. vLLM replicas on CUDA only. None = `rollout.dtype`.
    Counted by `validate`, `plan`, `fit` and `init` (memory per GPU and bytes per sync)."""
    gpu_memory_utilization: float = Field(0.85, gt=0, le=1)
    """Fraction of each rollout GPU vLLM may take for weights plus KV cache."""
    max_num_seqs: int = Field(256, gt=0)
    """Concurrent sequences per replica."""
    dtype: Literal["fp32", "bf16", "auto"] | None = None
    """Weights and compute precision of the rollout replicas, set apart from the trainer's `model.dtype`
    (None = the same). Synced weights are cast on load; a bf16 rollout against an fp32 trainer is a
    train–inference mismatch (per-token ratios ~0.6–1.5): pair it with rollout correction. `auto` = decided
    at launch like `trainer.precision = "auto"`, at a decode step's shapes (bf16 weights vs fp32)."""
    total_rollout_steps: int | None = Field(None, gt=0)
    """Total prompts to generate (verl's name; None = the whole data × `trainer.total_epochs`)."""
    val_temperature: float = Field(0.0, ge=0)
    """Temperature of validation generation (0 = greedy; verl's `val_kwargs.temperature`, and 0 when
    `val_kwargs.do_sample` is false)."""
    val_top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus of validation sampling (verl's `val_kwargs.top_p`; no effect when greedy)."""
    val_top_k: int = Field(0, ge=0)
    """Top-k of validation sampling (verl's `val_kwargs.top_k`; 0 = off, verl's −1)."""
    val_n: int = Field(1, gt=0, le=1024)
    """Answers per validation prompt (verl's `val_kwargs.n`). 1 = one answer, `…/mean@1`. n > 1 samples n
    answers per prompt with `val_temperature` (> 0: verl's `val_kwargs.do_sample`), `val_top_p`, `val_top_k` and
    logs verl's `mean@n`, `std@n`, `best@k`, `worst@k` and `maj@k` (k = 2, 4, 8, … < n and n;
    `engine.telemetry.val_metrics`)."""
    replicas: int | None = Field(None, gt=0)
    """Rollout replicas (None = rollout GPUs / GPUs per replica, tensor × pipeline × data parallel)."""
    weight_sync_bucket_mb: int = Field(512, gt=0)
    """Size of one weight-sync bucket in MiB."""
    weight_sync: Literal["auto", "shared_memory", "collective", "object_store"] = "auto"
    """How new weights reach the replicas; every transport moves the same pipeline (`engine.sync`): the trainer's
    weights in the model's dtype packed into flat `weight_sync_bucket_mb` buckets, bucket k+1 packed while k
    travels and loaded while k+1 arrives, every bucket checksummed on both ends (the delivery check: a mismatch
    fails the run naming the replica and the bucket). `auto` (default) resolves once, in the run plan
    (`launch --dry-run` shows it): `shared_memory` on a one-node CPU run with `hf` replicas, else `collective`.
    `shared_memory`: the trainer packs each bucket straight into a ring of 3 bucket-sized buffers in /dev/shm and
    every replica copies it from there into its parameters (one copy per side, no socket; ~3 × the bucket size of
    /dev/shm); needs device cpu, `hf` replicas and every replica on the trainer's host; the files are named
    with the run id and unlinked after the first sync of each ring (nothing is left in /dev/shm after a stop
    or a crash). `collective`: trainer rank 0 broadcasts each bucket over a stateless group with every replica
    (gloo on CPU — loopback TCP on one host, ~3× slower than shared memory —, NCCL on CUDA, HCCL on NPU, the
    last two untested here) straight into the `hf` sampler's parameters / each vLLM worker's loaders. For both,
    a replaced replica joins a new group generation and gets the last synced weights from a catch-up as soon
    as it is up (when the trainer has not stepped since; else with the next sync) — it generates nothing
    before; a replica whose process dies *during* a sync fails that sync (the run stops with a checkpoint).
    One sender (rank 0): the trainer's link to the replicas bounds it. `object_store`: one `ray.put` per
    bucket, each replica `ray.get`s them zero-copy (shared memory on one node, Ray's object transfer across
    nodes); the object store holds one version while replicas load it (it may spill beyond
    `object_store_memory`); a replacement loads the newest version at once."""
    weight_sync_back_buffer: Literal["auto", "on", "off"] = "auto"
    """Stage each sync in a back buffer (`hf` replicas; `engine.sync.staging`): a replica receives the new weights
    into a second copy of its weights while it keeps generating with the old ones, and the sync's pause is then
    only the wait for the current decode step plus an O(1) storage swap (rows generated before the swap carry
    the old version, after it the new one) instead of that wait plus the whole transfer. **Doubles the
    replica's weight memory.** `auto` (default): on where the replica's device has the memory free (at least
    twice the weights, and the weights + 1 GiB; decided per replica at its first sync, the buffer allocated
    then), else off; `on`: always (`hf` only); `off`: load in place during the pause (the old path). vLLM
    replicas always load in place."""
    multi_turn: MultiTurnConfig = Field(default_factory=MultiTurnConfig)
    """Multi-turn, tool-using rollouts (off by default)."""
    max_replica_restarts: int = Field(3, ge=0)
    """Replacement replicas the rollouter may start over the whole run after replica processes die (their
    in-flight prompts are re-queued and the replacement gets the current weights). One failure more stops
    the run cleanly: a checkpoint, exit code 1 and a message; resume it with `--resume auto`."""
