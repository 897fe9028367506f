"""Helpers shared by the multimodal tests (a uniquely named module: every test directory has a conftest)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def png_bytes(width: int, height: int, color: str = "white") -> bytes:
    """An encoded PNG of the given size."""
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (width, height), color).save(out, format="PNG")
    return out.getvalue()


def tiny_vl_config(run_dir: Path, *overrides: str) -> Any:
    """The tiny-vl-cpu preset (a `RunConfig`) with `overrides` (`a.b=v`, TOML literals) and its run dir."""
    from asyncrl_cli.config import load_run_config

    preset = Path(__file__).resolve().parents[2] / "presets" / "runs" / "tiny-vl-cpu.toml"
    res = load_run_config(preset, [f'logging.run_dir="{run_dir}"', "logging.progress=false", *overrides])
    assert res.config is not None, [str(p) for p in res.problems]
    return res.config


def train_records(run_dir: Path) -> list[dict]:
    """The trainer's per-step records of a run directory."""
    import json

    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return [r for r in (json.loads(x) for x in lines if x.strip()) if "critic/rewards/mean" in r]
