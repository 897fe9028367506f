"""Launch real asyncrl runs (the same `engine.runtime.driver.run` the CLI uses) and summarise their
`metrics.jsonl` / `ledger.jsonl` into the numbers the async-vs-sync and staleness studies compare."""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.metrics import final_stats

SYNC_OVERRIDES = (
    'async_training.mode="sync"',
    "async_training.staleness_threshold=0.0",
    "async_training.partial_rollout=false",
)
"""What turns a fully async preset into its synchronous baseline (exactly `presets/runs/tiny-cpu-sync.toml`)."""


@dataclass
class RunSummary:
    """One run, reduced. Times in seconds.

    `wall_s` is the whole `run()` (Ray actors and model start-up included); `train_wall_s` the trainer's
    clock at its last step (`asyncrl/time`, from the trainer's start). The comparison uses the steady
    state, steps 2…K, which drops the first step: the rollouter starts generating while the trainer is
    still loading its model, a head start that differs between modes and would dominate short runs.

        steady_wall_s       = asyncrl/time[K] − asyncrl/time[1]
        steady_prompts_per_s = trained_prompts · (K − 1)/K ÷ steady_wall_s
        T_gen   = Σ_{k≥2} timing_s/gen_k                        (the trainer waiting for rollouts)
        T_train = Σ_{k≥2} (timing_s/step_k − timing_s/gen_k)    (log-probs, update, sync, bookkeeping)

    With a single step the steady state is that step (time from the trainer's start). `median_step_s` is
    the median of `timing_s/step` over the same steps: on a shared machine a few steps stalled by other
    processes inflate the sums, not the median."""

    label: str
    overrides: list[str]
    wall_s: float
    train_wall_s: float
    steady_wall_s: float
    median_step_s: float
    steps: int
    trained_prompts: int
    prompts_per_s: float
    t_gen: float
    t_train: float
    final_reward: float
    final_reward_se: float
    staleness_mean: float
    staleness_max: float
    partial_ratio: float
    trainer_tokens_per_s: float
    rollout_tokens_per_s: float
    curve: dict[str, list[float]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def summarize(
    label: str,
    overrides: Sequence[str],
    records: list[dict[str, Any]],
    ledger: list[dict[str, Any]],
    wall_s: float,
) -> RunSummary:
    """Reduce one run's per-step records (training records only) and ledger to a `RunSummary`."""
    train = [r for r in records if "critic/rewards/mean" in r]
    if not train:
        raise ValueError(f"run {label!r} recorded no training step")
    rewards = [float(r["critic/rewards/mean"]) for r in train]
    final, se = final_stats(rewards)
    trained = sum(1 for e in ledger if e.get("status") == "trained")
    train_wall = float(train[-1]["asyncrl/time"])
    steady = train[1:] if len(train) > 1 else train
    steady_wall = train_wall - (float(train[0]["asyncrl/time"]) if len(train) > 1 else 0.0)
    steady_prompts = trained * len(steady) / len(train)
    t_gen = sum(float(r.get("timing_s/gen", 0.0)) for r in steady)
    t_step = sum(float(r.get("timing_s/step", 0.0)) for r in steady)

    def mean_of(key: str) -> float:
        vals = [float(r[key]) for r in train if key in r]
        return sum(vals) / len(vals) if vals else 0.0

    return RunSummary(
        label=label,
        overrides=list(overrides),
        wall_s=round(wall_s, 3),
        train_wall_s=train_wall,
        steady_wall_s=steady_wall,
        median_step_s=statistics.median(float(r.get("timing_s/step", 0.0)) for r in steady),
        steps=len(train),
        trained_prompts=trained,
        prompts_per_s=steady_prompts / steady_wall if steady_wall > 0 else 0.0,
        t_gen=t_gen,
        t_train=max(0.0, t_step - t_gen),
        final_reward=final,
        final_reward_se=se,
        staleness_mean=mean_of("asyncrl/staleness/mean"),
        staleness_max=max(float(r.get("asyncrl/staleness/max", 0)) for r in train),
        partial_ratio=mean_of("fully_async/partial/partial_ratio"),
        trainer_tokens_per_s=mean_of("asyncrl/trainer/tokens_per_s"),
        rollout_tokens_per_s=mean_of("asyncrl/rollout/tokens_per_s"),
        curve={
            "step": [int(r["training/global_step"]) for r in train],
            "time": [float(r["asyncrl/time"]) for r in train],
            "reward": rewards,
            "gen_s": [float(r.get("timing_s/gen", 0.0)) for r in train],
            "step_s": [float(r.get("timing_s/step", 0.0)) for r in train],
        },
    )


@contextlib.contextmanager
def ray_session(object_store_bytes: int = 1 << 30) -> Iterator[None]:
    """A local Ray cluster shared by every run inside the block (the driver joins an initialised Ray
    instead of starting its own), so runs pay actor start-up only. Reuses a cluster that is already up."""
    import ray

    if ray.is_initialized():
        yield
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(
        address="local",  # always a private cluster, never one another user started with `ray start`
        num_cpus=max(os.cpu_count() or 2, 2),
        include_dashboard=False,
        namespace="asyncrl",
        log_to_driver=False,
        logging_level="ERROR",
        object_store_memory=object_store_bytes,
    )
    try:
        yield
    finally:
        ray.shutdown()


def load_config(preset: Path, overrides: Sequence[str]) -> Any:
    """The validated RunConfig of `preset` with `overrides`, or ValueError listing the errors."""
    from asyncrl_cli.config import load_run_config

    res = load_run_config(preset, list(overrides))
    if res.config is None:
        errors = [f"{p.key}: {p.message}" for p in res.problems if p.severity == "error"]
        raise ValueError(f"{preset.name} with {list(overrides)} is invalid: {'; '.join(errors)}")
    return res.config


def launch(preset: Path, overrides: Sequence[str], run_root: Path, label: str) -> RunSummary:
    """Run `preset` with `overrides` to the end in this process's Ray session and summarise it."""
    from engine.runtime.driver import run
    from engine.plan.run_plan import resolve_plan

    run_dir = run_root / label
    name = f"bench-{label}-{os.getpid()}"
    full = [*overrides, f'logging.run_dir="{run_dir}"', "logging.progress=false", f'name="{name}"']
    cfg = load_config(preset, full)
    start = time.perf_counter()
    code = run(resolve_plan(cfg), progress=False)
    wall = time.perf_counter() - start
    if code != 0:
        raise RuntimeError(
            f"run {label!r} ({preset.name} {list(overrides)}) exited with {code}; see {run_dir}"
        )
    return summarize(
        label, overrides, read_jsonl(run_dir / "metrics.jsonl"), read_jsonl(run_dir / "ledger.jsonl"), wall
    )
