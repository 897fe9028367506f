"""`asyncrl rehearse` on a deliberately broken layout: the seed-000 preset with expert groups (etp × ep = 64) that
do not divide the ranks of a pipeline stage (tp × cp × dp = 32) fails in one line per rank class, naming the role,
the rank and the phase, with exit code 1 and no traceback (the layout check runs before any model is built: ~10 s)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from asyncrl_cli.app import app

SEED = Path(__file__).resolve().parents[2] / "presets" / "runs" / "qwen3-30b-a3b-base-dapo-megatron-96-32.toml"
BROKEN = ["--set", "trainer.ep=16", "--set", "trainer.etp=4"]


def test_broken_expert_layout_fails_naming_trainer_ranks() -> None:
    r = CliRunner().invoke(app, ["rehearse", str(SEED), *BROKEN])
    assert r.exit_code == 1
    assert "rehearsal failed: trainer rank 0 (layout): ParallelConfigError: etp×ep = 4×16 must divide" in r.output
    assert "rehearsal failed: trainer rank 1 (layout)" in r.output
    assert "Traceback" not in r.output


def test_broken_layout_json_names_role_rank_and_phase() -> None:
    r = CliRunner().invoke(app, ["rehearse", str(SEED), *BROKEN, "--json"])
    assert r.exit_code == 1
    doc = json.loads(r.stdout)
    assert not doc["ok"] and doc["ranks"] == []
    assert [(f["role"], f["rank"], f["phase"]) for f in doc["failures"]] == [("trainer", 0, "layout"),
                                                                               ("trainer", 1, "layout")]
    assert doc["transport"]["kind"] == "collective" and doc["transport"]["backend"] == "nccl"
    assert doc["vllm"]["engine_args"]["tensor_parallel_size"] == 4
