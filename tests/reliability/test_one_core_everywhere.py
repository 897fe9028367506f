"""The simulator and a real run execute the same `TrainerLoop`: a change to one of its decisions (here the
sync cadence, `TrainerLoop.due`) changes a simulated run and a real tiny run the same way, and the
simulator's checker, which states the cadence contract on its own, reports the change."""

from __future__ import annotations

import os
import textwrap

import pytest
from reliability_helpers import launch, train_steps

from engine.loop.sim.runner import run_scenario
from engine.loop.sim.scenario import Scenario
from engine.loop.trainer import TrainerLoop

STEPS = 6
# the tiny preset's shape with reliability_helpers.SMALL: 8 prompts of 4 answers a step, a sync every step, a
# staleness budget of two steps' prompts per version (so a run that syncs every other step can still go on)
SHAPE = Scenario(seed=26, n=4, ppo_mini_batch_size=8, trigger=1, staleness_threshold=1.0, total_prompts=8 * STEPS)
EXTRA = (f"rollout.total_rollout_steps={8 * STEPS}", "async_training.trigger_parameter_sync_step=1",
         "async_training.staleness_threshold=1.0")


def _every_other_due(self: TrainerLoop) -> bool:
    return self.since_sync >= 2 * self.trigger


def test_a_changed_cadence_changes_the_simulated_run(monkeypatch) -> None:
    out = run_scenario(SHAPE)
    assert not out.violations and out.records == [(s, s) for s in range(1, STEPS + 1)]
    monkeypatch.setattr(TrainerLoop, "due", _every_other_due)
    changed = run_scenario(SHAPE)
    assert changed.records == [(s, s // 2) for s in range(1, STEPS + 1)]
    assert any("cadence" in v for v in changed.violations), changed.violations


@pytest.mark.slow
@pytest.mark.integration
def test_a_changed_cadence_changes_a_real_run_the_same_way(tmp_path, monkeypatch) -> None:
    site = tmp_path / "site"
    site.mkdir()
    # every process of the run (the driver and each Ray worker) starts with the same change to the core
    (site / "sitecustomize.py").write_text(textwrap.dedent('''
        from engine.loop import trainer
        trainer.TrainerLoop.due = lambda self: self.since_sync >= 2 * self.trigger
    '''))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    run_dir = tmp_path / "run"
    proc = launch(run_dir, *EXTRA)
    out, _ = proc.communicate(timeout=480)
    assert proc.returncode == 0, out[-3000:]
    monkeypatch.setattr(TrainerLoop, "due", _every_other_due)
    assert train_steps(run_dir) == run_scenario(SHAPE).records == [(s, s // 2) for s in range(1, STEPS + 1)]
