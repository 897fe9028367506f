"""Helpers for the integration tests: the tiny preset with overrides, run-dir readers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from asyncrl_cli.config import load_run_config

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "presets" / "runs" / "tiny-cpu.toml"


def tiny_config(run_dir: Path, *overrides: str, preset: Path = TINY) -> Any:
    """The tiny-cpu preset with `overrides` (`a.b=v`, TOML literals) and its run dir under tmp."""
    res = load_run_config(preset, [f'logging.run_dir="{run_dir}"', "logging.progress=false", *overrides])
    assert res.config is not None, [str(p) for p in res.problems]
    return res.config


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def train_records(run_dir: Path) -> list[dict]:
    return [r for r in read_jsonl(run_dir / "metrics.jsonl") if "critic/rewards/mean" in r]
