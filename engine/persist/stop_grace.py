"""What a graceful stop writes when it has a deadline (pure; the clock is the caller's).

A cluster scheduler sends SIGTERM and, a grace period later, SIGKILL (Slurm: `KillWait`, 30 s by default;
Kubernetes: `terminationGracePeriodSeconds`, 30 s by default). Neither publishes that period to the job's
environment (Slurm's is in `slurm.conf`, `scontrol show config`; the Kubernetes downward API does not offer
it), so the run is told: `resources.stop_grace_s`, else the environment variable `ASYNCRL_STOP_GRACE_S` (set
it in the job script or the pod spec from the same number). Without either the stop has no deadline and writes
the full checkpoint (the driver waits up to `STOP_TIMEOUT_S` for it).

With a deadline the trainer, at its next step boundary, chooses

* `full` — the whole checkpoint — when its expected time fits: `FULL_MARGIN` × the expected time ≤ the time
  left. The expected time is the last full checkpoint's measured write time, else a prior from the size of the
  weights: `STATE_BYTES_PER_WEIGHT_BYTE` × weight bytes / `PRIOR_WRITE_BYTES_PER_S`;
* `light` — otherwise: the cheapest state that keeps the ledger exact. The prompt stream's position, the
  counters, the queued groups and the in-flight prompts of this step (kilobytes), with the trainer state
  (weights, optimizer) of the last full checkpoint hard-linked, not rewritten — or, when there is none, the
  model's initial weights. A resume from it loses no prompt (each is trained, queued or re-issued exactly
  once); the weight updates of the steps since that full checkpoint are not in it, and the stop line, the
  `stop` event and the resume line say so.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.config.schema import RunConfig

GRACE_ENV = "ASYNCRL_STOP_GRACE_S"
EXIT_RESERVE_S = 0.5
"""Of the grace period, the part left to the driver after the trainer's stop state: the `stop` event, the
resume line, killing the actors."""
FULL_MARGIN = 1.5
PRIOR_WRITE_BYTES_PER_S = 200e6
STATE_BYTES_PER_WEIGHT_BYTE = 4.0
"""fp32 weights + Adam's two moments + reading them back for the checksums, per byte of weights."""


def stop_grace_s(cfg: RunConfig, environ: dict[str, str] | None = None) -> float | None:
    """The grace period of a stop: `resources.stop_grace_s`, else `$ASYNCRL_STOP_GRACE_S`, else None."""
    if cfg.resources.stop_grace_s is not None:
        return float(cfg.resources.stop_grace_s)
    raw = (os.environ if environ is None else environ).get(GRACE_ENV, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if value > 0 else None


def stop_deadline(signalled_at: float, grace_s: float | None) -> float | None:
    """When the trainer's stop state must be on disk: the signal's time + the grace − `EXIT_RESERVE_S`."""
    if grace_s is None:
        return None
    return signalled_at + grace_s - min(EXIT_RESERVE_S, grace_s / 4)


def full_checkpoint_s(measured_s: float | None, weight_bytes: int) -> float:
    """The expected write time of a full checkpoint: the last measured one, else the size prior."""
    if measured_s is not None:
        return measured_s
    return STATE_BYTES_PER_WEIGHT_BYTE * weight_bytes / PRIOR_WRITE_BYTES_PER_S


def choose_stop_state(now: float, deadline: float | None, expected_full_s: float) -> str:
    """`full` when there is no deadline or the full checkpoint fits before it with `FULL_MARGIN`; else `light`."""
    if deadline is None or FULL_MARGIN * expected_full_s <= deadline - now:
        return "full"
    return "light"
