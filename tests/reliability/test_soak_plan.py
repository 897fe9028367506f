"""The chaos soak's sizing (`scripts/soak.py`, `plan`): an arm's steps come from the step time and start-up a probe
measured, so that its runs fit the arm's share of `--minutes` — more time or faster steps give more steps, a share
too small for anything but start-ups gives the floor, and the count is even (a sync every 2 steps)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

SOAK = Path(__file__).resolve().parents[2] / "scripts" / "soak.py"
spec = importlib.util.spec_from_file_location("soak_script", SOAK)
soak = sys.modules.setdefault("soak_script", importlib.util.module_from_spec(spec))
spec.loader.exec_module(soak)
KINDS = list(soak.KINDS)


def test_the_runs_of_a_planned_arm_fit_its_share() -> None:
    for budget, startup, step, reference in [(840, 60, 0.3, True), (840, 60, 0.3, False), (1800, 20, 0.5, True)]:
        n = soak.plan(budget, startup, step, reference, KINDS)
        q = sum(k in soak.RELAUNCHING for k in KINDS) / len(KINDS)
        f = q * (startup + 2 * step) / soak.FAULT_GAP_S + 5 / 60
        runs = (1 if reference else 0) + 1 / (1 - f)  # the reference, and the faulted run with its overhead
        spent = (startup + n * step) * runs
        assert n % 2 == 0 and budget - 2 * step * runs <= spent <= budget, (budget, startup, step, n, spent)


def test_more_time_or_faster_steps_give_more_steps_and_a_tiny_share_the_floor() -> None:
    base = soak.plan(840, 60, 0.3, True, KINDS)
    assert soak.plan(1800, 60, 0.3, True, KINDS) > base > soak.plan(840, 60, 0.6, True, KINDS)
    assert soak.plan(840, 60, 0.3, False, KINDS) > base  # no reference run to fit beside it
    assert soak.plan(60, 90, 0.3, True, KINDS) == soak.MIN_STEPS


def test_the_checkpoint_disk_holds_the_kept_checkpoints_a_new_one_and_a_stop_checkpoint(tmp_path: Path) -> None:
    """The disk-full fault's tmpfs is sized from the probe's largest checkpoint: after the fill ends, the kept
    checkpoints (keep_last = 2), the one being written and a stop checkpoint fit (a fixed 64 MB did not)."""
    ckpts = tmp_path / "checkpoints"
    for name, mb in (("step-4", 20), ("step-6", 22)):
        (ckpts / name / "trainer").mkdir(parents=True)
        with (ckpts / name / "trainer" / "state.pt").open("wb") as f:
            f.truncate(mb << 20)  # a sparse file of that size
    largest = soak.largest_checkpoint_mb(ckpts)
    assert largest == 22
    assert soak.disk_mb(largest) >= 4 * largest
    assert soak.disk_mb(soak.largest_checkpoint_mb(tmp_path / "none")) == 64  # no checkpoint seen: the floor
