"""The derived quantities verl's fully-async rollouter prints at start-up (see `engine.plan.sizes` for the math).

The formulas live once, in `engine.plan.sizes`, which the engine uses too (the engine never imports
the CLI package); this module keeps the CLI's names.
"""

from __future__ import annotations

from engine.plan.sizes import (
    Derived,
    builtin_train_size,
    dataset_train_size,
    derive,
    effective_staleness,
    max_queue_size,
    max_required_samples,
    optimizer_steps_per_local_step,
    parquet_rows,
    required_samples,
    rollout_replicas,
    rollout_world,
    trainer_dp,
    trainer_world,
)

__all__ = [
    "Derived",
    "builtin_train_size",
    "dataset_train_size",
    "derive",
    "effective_staleness",
    "max_queue_size",
    "max_required_samples",
    "optimizer_steps_per_local_step",
    "parquet_rows",
    "required_samples",
    "rollout_replicas",
    "rollout_world",
    "trainer_dp",
    "trainer_world",
]
