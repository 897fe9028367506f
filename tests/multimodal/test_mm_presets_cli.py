"""The figure-task reward, `asyncrl data prepare geo3k`, and the multimodal presets (validate / dry-run)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from mm_helpers import png_bytes
from typer.testing import CliRunner

from asyncrl_cli.app import app
from asyncrl_cli.config import load_run_config
from engine.data.rewards import figures, get_reward_fn

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("response, finished, score", [
    ("24", True, 1.0), ("\\boxed{24.0}", True, 1.0), ("24", False, 0.9), ("2x", True, 0.3), ("7", True, 0.1),
    ("the", True, 0.0),
])
def test_figures_reward_ladder(response: str, finished: bool, score: float) -> None:
    assert figures(response, "24", finished=finished)["score"] == pytest.approx(score)
    assert get_reward_fn("auto", "asyncrl/figures") is figures


def test_prepare_geo3k_from_a_local_copy(tmp_path: Path) -> None:
    src = tmp_path / "geometry3k" / "data"
    src.mkdir(parents=True)
    fig = {"bytes": png_bytes(60, 40), "path": "0.png"}
    rows = [{"images": [fig], "problem": "<image>Find x.", "answer": "3"},
            {"images": [{"bytes": b"not an image", "path": "1.png"}], "problem": "<image>Find y.", "answer": "4"},
            {"images": [], "problem": "<image>Find z.", "answer": "5"}]
    pq.write_table(pa.Table.from_pylist(rows), src / "train-00000-of-00001.parquet")
    pq.write_table(pa.Table.from_pylist(rows[:1]), src / "test-00000-of-00001.parquet")
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["data", "prepare", "geo3k", "--from", str(src.parent), "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report["train"] == {"path": str(out / "train.parquet"), "rows": 1, "skipped_bad_image": 1,
                               "skipped_image_mismatch": 1}
    (row,) = pq.read_table(out / "train.parquet").to_pylist()
    assert row["data_source"] == "hiyouga/geometry3k" and row["reward_model"]["ground_truth"] == "3"
    assert row["prompt"][0]["content"].startswith("<image>Find x. ") and "\\boxed{}" in row["prompt"][0]["content"]
    assert row["images"][0]["bytes"] == fig["bytes"] and row["extra_info"]["split"] == "train"
    bad = CliRunner().invoke(app, ["data", "prepare", "geo3k", "--from", str(tmp_path / "nope"), "--out", str(out)])
    assert bad.exit_code == 1 and "not a directory" in bad.output


@pytest.mark.parametrize("preset", ["qwen3-vl-8b-geo3k-fsdp2-npu-16-16", "qwen3-vl-8b-geo3k-fsdp2-npu-2x8",
                                    "tiny-vl-cpu"])
def test_multimodal_presets_validate(preset: str) -> None:
    res = load_run_config(REPO / "presets" / "runs" / f"{preset}.toml", [])
    errors = [str(p) for p in res.problems if p.severity == "error"]
    assert res.config is not None and not errors, errors
    assert res.config.data.image_key == "images"


def test_geo3k_seed_preset_dry_runs(tmp_path: Path) -> None:
    preset = REPO / "presets" / "runs" / "qwen3-vl-8b-geo3k-fsdp2-npu-16-16.toml"
    res = CliRunner().invoke(app, ["launch", str(preset), "--dry-run", "--set", f'logging.run_dir="{tmp_path}/r"'])
    assert res.exit_code == 0, res.output
    assert "dry run: nothing started" in res.output
