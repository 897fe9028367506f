"""The one builder of a run's event records (`events.jsonl`, the dashboard's event log, `ctl`'s history).

An event is a flat dict: `time` (Unix seconds, when it was built), `kind` (what happened: sync, checkpoint, knob,
warning, …), `level` (info / warning / error), `step` and `version` (the local step and the policy version the
emitting role was at — None where it has none, e.g. the driver before the run started), `message` (one line for a
person), and any `extra` fields of that kind (e.g. a sync's bytes, a knob's old and new values). The driver, the
trainer shell and the rollout shell build theirs here; the controller fills what a record left out (its own
step and version) when it records it."""

from __future__ import annotations

import time
from typing import Any


def run_event(level: str, kind: str, message: str, step: int | None, version: int | None,
              **extra: Any) -> dict[str, Any]:
    """An event record (module docstring)."""
    return {"time": time.time(), "kind": kind, "level": level, "step": step, "version": version,
            "message": message, **extra}
