"""(c) The trainer's process dies: non-zero exit, a message naming the cause and the checkpoint to resume
from; a checkpoint truncated on purpose is detected and skipped, and the resume from the previous one ends
with every step once and an exact ledger."""

from __future__ import annotations

import pytest
from reliability_helpers import assert_ledger_exact, events, tiny_config, train_steps

from engine.runtime.driver import run
from engine.plan.run_plan import resolve_plan

pytestmark = pytest.mark.integration

EXTRA = ("rollout.total_rollout_steps=160", "checkpoint.every_versions=2", "checkpoint.keep_last=3")


def test_trainer_death_is_a_failure_with_a_resumable_checkpoint(tmp_path, capsys) -> None:
    run_dir = tmp_path / "run"
    cfg = tiny_config(run_dir, *EXTRA, "debug.kill_trainer_at_step=5")
    assert run(resolve_plan(cfg), progress=False) == 1
    err = capsys.readouterr().err
    line = [ln for ln in err.splitlines() if "run failed" in ln]
    assert len(line) == 1, err
    assert "trainer failed: its process died" in line[0]
    assert "could not be saved" in line[0] and "global_step_4 (step 4)" in line[0]
    assert f"--resume {run_dir}" in line[0], line[0]  # a command that works when pasted
    assert any(e["level"] == "error" and "trainer failed" in e["message"] for e in events(run_dir))

    # the newest checkpoint is truncated on purpose: the resume must notice and take the one before
    weights = run_dir / "checkpoints" / "global_step_4" / "trainer" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    cfg = tiny_config(run_dir, *EXTRA, "debug.kill_trainer_at_step=0")
    assert run(resolve_plan(cfg), resume="auto", progress=False) == 0
    err = capsys.readouterr().err
    assert "global_step_4 is corrupt" in err and "truncated" in err and "skipped" in err
    assert any("global_step_4" in e["message"] for e in events(run_dir, "checkpoint") if e["level"] == "warning")
    resumed = events(run_dir, "resume")
    assert len(resumed) == 1 and resumed[0]["step"] == 2 and resumed[0]["path"].endswith("global_step_2")
    assert [s for s, _ in train_steps(run_dir)] == list(range(1, 21))
    assert_ledger_exact(cfg, run_dir, trained=160)
