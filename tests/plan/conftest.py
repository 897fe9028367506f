"""A small recorded run directory, built the way the runtime writes one (config.resolved.json + metrics.jsonl)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asyncrl_cli.config import load_run_config

ROOT = Path(__file__).resolve().parents[2]
TINY_SYNC = ROOT / "presets" / "runs" / "tiny-cpu-sync.toml"


def write_run_dir(path: Path, *, steps: int = 24, busy: float = 0.5, gen_wait: float = 0.2, sync: float = 0.05,
                  pause: float = 0.01, active: float = 0.2, mean_len: float = 3.5, clip: float = 0.5,
                  token_cost: float | None = None, preset: Path = TINY_SYNC) -> Path:
    """A run dir whose every step spends `busy` s training (plus `token_cost` s per response token when
    given, with lengths that vary), waits `gen_wait` s for data and syncs in `sync` s (`pause` of it paused);
    the rollouter is active `active` s per version."""
    res = load_run_config(preset)
    assert res.config is not None
    cfg = res.config
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.resolved.json").write_text(json.dumps(cfg.model_dump(mode="json")))
    seqs = cfg.trainer.ppo_mini_batch_size * cfg.rollout.n
    rows, t = [], 0.0
    for i in range(1, steps + 1):
        length = mean_len if token_cost is None else (1.5 + (i % 5) * 0.5)
        train = busy + (token_cost or 0.0) * length * seqs
        step = gen_wait + train + sync
        t += step
        rows.append({"training/global_step": i, "asyncrl/time": t, "timing_s/step": step, "timing_s/gen": gen_wait,
                     "timing_s/param_sync": sync, "asyncrl/sync/pause_s": pause,
                     "fully_async/trainer/idle_ratio": gen_wait / step,
                     "fully_async/rollouter/active_time": active, "fully_async/rollouter/idle_ratio": 1 - active / step,
                     "response_length/mean": length, "response_length/clip_ratio": clip})
        if i % 10 == 0:
            rows.append({"val-core/x/reward/mean@1": 0.5, "training/global_step": i})  # a validation row
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"torn')
    return path


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return write_run_dir(tmp_path / "runs" / "tiny-sync")


@pytest.fixture
def make_run_dir():
    """`write_run_dir` itself, for tests that record other costs."""
    return write_run_dir
