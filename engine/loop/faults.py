"""The trainer's fault plan: which injected faults (`[debug]`, `engine.plan.role_parts.FaultSpec`) fire when, as
commands the shell carries out like any other (`engine.loop.commands.ExitProcess`).

`kill_trainer_at_step = k` (k ≥ 1; 0 = off): the trainer's process dies in local step k, after its optimizer
update and before the step reaches the ledger — the weights moved, nothing of the step is recorded, no checkpoint
is cut. A resume from a checkpoint at or past step k never reaches k's update again, so the fault fires at most once
per run unless the run resumes from before it (pass `--set debug.kill_trainer_at_step=0` then).
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.loop.commands import ExitProcess

TRAINER_KILLED_EXIT = 17
"""The exit code of a trainer killed by `kill_trainer_at_step` (what the driver sees of its process)."""


@dataclass(frozen=True)
class FaultPlan:
    """The faults to inject into the trainer (0 = none)."""

    kill_trainer_at_step: int = 0

    def after_update(self, step: int) -> list[ExitProcess]:
        """Local step `step` (1-based) has just updated the weights: the faults that fire now."""
        if self.kill_trainer_at_step and step == self.kill_trainer_at_step:
            return [ExitProcess(TRAINER_KILLED_EXIT, f"debug.kill_trainer_at_step={step}")]
        return []
