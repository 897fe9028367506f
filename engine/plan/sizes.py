"""The derived quantities verl's fully-async rollouter prints at start-up, as pure functions of the run config.

Prompts are the unit (each prompt yields `rollout.n` responses):

    required_samples     = ppo_mini_batch_size × require_batches                 (prompts per local step)
    max_required_samples = int(required_samples × (1 + staleness_threshold) × trigger_parameter_sync_step)
    max_queue_size       = max_required_samples
    total_rollout_steps  = min(rollout.total_rollout_steps or ∞, train_size × total_epochs)
    total_train_steps    = trainer.total_steps or int(total_rollout_steps / (required_samples × trigger))
    total_local_steps    = total_train_steps × trigger
    optimizer_steps_per_local_step = require_batches × ppo_epochs          (verl's mini-batch loop)

and the sizes of the two pools:

    M = trainer_world    = resources.trainer.nnodes × gpus_per_node               (trainer ranks)
    rollout_world        = resources.rollout.nnodes × gpus_per_node
    R = rollout_replicas = rollout.replicas or max(1, rollout_world // G)   G = TP·PP·DP, one replica's GPUs
    trainer_dp           = max(1, M // (tp·pp·cp)) for megatron, M // s for torch (FSDP2; s = Ulysses SP size)

`total_train_steps` counts policy versions, like verl. In `mode = "sync"` the staleness threshold is
forced to 0, so `max_required_samples = required_samples × trigger`.

`cfg` is the validated `RunConfig` (`engine.config.schema`, imported for the annotations only, so this module
stays cheap to import).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.config.schema import RunConfig


@dataclass(frozen=True)
class Derived:
    """Derived sizes of a run (None where the data size is unknown and nothing else bounds it)."""

    required_samples: int
    max_required_samples: int
    max_queue_size: int
    staleness_threshold: float
    """The effective threshold (0 in sync mode)."""
    prompts_per_version: int
    sequences_per_local_step: int
    train_size: int | None
    total_rollout_steps: int | None
    total_train_steps: int | None
    total_local_steps: int | None
    trainer_world: int
    rollout_world: int
    rollout_replicas: int
    trainer_dp: int
    optimizer_steps_per_local_step: int = 1
    """require_batches mini-batches of ppo_mini_batch_size × n sequences, ppo_epochs passes: one optimizer
    step each (verl's actor update)."""
    """Data-parallel size of the trainer: world / (tp·pp·cp) for megatron, world for torch (FSDP)."""

    def to_json(self) -> dict[str, Any]:
        """A plain dict for `--json` output."""
        return asdict(self)


def effective_staleness(cfg: RunConfig) -> float:
    """The staleness threshold in force: 0 in sync mode (`engine.loop.budget.staleness_in_force`)."""
    from engine.loop.budget import staleness_in_force

    return staleness_in_force(cfg.async_training.staleness_threshold, cfg.async_training.mode == "sync")


def required_samples(cfg: RunConfig) -> int:
    """Prompts per local step: ppo_mini_batch_size × require_batches (`engine.loop.params.prompts_per_step`)."""
    from engine.loop.params import prompts_per_step

    return prompts_per_step(cfg)


def max_required_samples(cfg: RunConfig) -> int:
    """int(required_samples × (1 + staleness) × trigger_parameter_sync_step), by the rollouter's own budget rule
    (`engine.loop.budget`, pure Python), so the number printed is the one the run admits."""
    from engine.loop.budget import max_required_samples as budget_limit

    trigger = cfg.async_training.trigger_parameter_sync_step
    return budget_limit(required_samples(cfg), effective_staleness(cfg), trigger)


def max_queue_size(cfg: RunConfig) -> int:
    """Bound of the message queue in prompt groups: max_required_samples."""
    return max_required_samples(cfg)


def trainer_world(cfg: RunConfig) -> int:
    """M, the trainer ranks: `resources.trainer.nnodes × gpus_per_node` (on CPU hardware a "GPU" is a process)."""
    return int(cfg.resources.trainer.nnodes * cfg.resources.trainer.gpus_per_node)


def rollout_world(cfg: RunConfig) -> int:
    """Accelerators of the rollout pool: `resources.rollout.nnodes × gpus_per_node`."""
    return int(cfg.resources.rollout.nnodes * cfg.resources.rollout.gpus_per_node)


def rollout_replicas(cfg: RunConfig) -> int:
    """R, the rollout engines: `rollout.replicas`, else one per G rollout GPUs (at least 1; G = TP·PP·DP,
    `engine.plan.rollout_replica.replica_gpus`)."""
    from engine.plan.rollout_replica import replica_gpus

    return cfg.rollout.replicas or max(1, rollout_world(cfg) // replica_gpus(cfg))


def optimizer_steps_per_local_step(cfg: RunConfig) -> int:
    """require_batches × ppo_epochs: verl's actor makes one optimizer step per mini-batch and pass."""
    return cfg.async_training.require_batches * cfg.trainer.ppo_epochs


def trainer_dp(cfg: RunConfig) -> int:
    """Data-parallel size of the trainer: M / (tp·pp·cp) for megatron, M / s for torch (FSDP2, s =
    `ulysses_sequence_parallel_size`: the ranks of one SP group hold the same rows; M when s does not divide M,
which `validate` refuses on its own); at least 1."""
    t = cfg.trainer
    sp = t.ulysses_sequence_parallel_size
    model_par = t.tp * t.pp * t.cp if t.backend == "megatron" else (sp if trainer_world(cfg) % sp == 0 else 1)
    return max(1, trainer_world(cfg) // model_par)


def builtin_train_size(cfg: RunConfig) -> int | None:
    """`data.train_size`, or the built-in task's default size, for a `builtin:NAME` training set."""
    files = cfg.data.train_files
    if len(files) != 1 or not files[0].startswith("builtin:"):
        return None
    if cfg.data.train_size is not None:
        return cfg.data.train_size
    try:
        from engine.data.builtin import DEFAULT_SIZES  # a constant table; no torch behind it
    except ImportError:
        return None
    size = DEFAULT_SIZES.get(files[0].removeprefix("builtin:"))
    return size[0] if size else None


def parquet_rows(files: list[str], base_dir: Path | None = None) -> int | None:
    """Total rows of local parquet files (from their footers), or None if any is missing/unreadable."""
    paths = []
    for f in files:
        p = Path(f).expanduser()
        if not p.is_absolute() and base_dir is not None and not p.exists():
            p = base_dir / p
        if not p.is_file():
            return None
        paths.append(p)
    if not paths:
        return None
    try:
        import pyarrow.parquet as pq  # only reached when the files exist locally
    except ImportError:
        return None
    try:
        return sum(pq.read_metadata(p).num_rows for p in paths)
    except Exception:  # noqa: BLE001 - any unreadable footer means "unknown"
        return None


def derive(cfg: RunConfig, train_size: int | None = None) -> Derived:
    """All derived quantities; `train_size` (prompts) comes from the caller when the data is local."""
    a, t, r = cfg.async_training, cfg.trainer, cfg.rollout
    req = required_samples(cfg)
    max_req = max_required_samples(cfg)
    size = train_size if train_size is not None else builtin_train_size(cfg)
    candidates = [x for x in (r.total_rollout_steps, size * t.total_epochs if size else None) if x]
    total_rollout = min(candidates) if candidates else None
    per_version = req * a.trigger_parameter_sync_step
    from engine.loop.params import train_versions  # the loop's own formula (pure Python)

    total_train = train_versions(t.total_steps, total_rollout, per_version)
    return Derived(
        required_samples=req,
        max_required_samples=max_req,
        max_queue_size=max_req,
        staleness_threshold=effective_staleness(cfg),
        prompts_per_version=per_version,
        sequences_per_local_step=req * r.n,
        train_size=size,
        total_rollout_steps=total_rollout,
        total_train_steps=total_train,
        total_local_steps=None if total_train is None else total_train * a.trigger_parameter_sync_step,
        trainer_world=trainer_world(cfg),
        rollout_world=rollout_world(cfg),
        rollout_replicas=rollout_replicas(cfg),
        trainer_dp=trainer_dp(cfg),
        optimizer_steps_per_local_step=optimizer_steps_per_local_step(cfg),
    )


def dataset_train_size(cfg: RunConfig, base_dir: Path | None = None) -> int | None:
    """Training prompts: the built-in task's size, or the rows of local parquet files (None if unknown)."""
    size = builtin_train_size(cfg)
    if size is None and not cfg.data.train_files[0].startswith("builtin:"):
        size = parquet_rows(cfg.data.train_files, base_dir)
    return size
