"""Runtime knobs: validation and parsing against the knob table, and the controller's per-knob state.

The table itself (kind, range, owner, followers, boundary, refusal, preview, config and checkpoint paths) is
`engine.control.knob_table.KNOBS`. Pure Python; used by the controller (`engine.control.controller`), the dashboard's
input validator and `asyncrl ctl`, so a value is accepted or refused by exactly the same rule everywhere; every
function looks the table up at call time, so a knob added to it is validated, seeded and resumed like the others.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from engine.control.knob_table import KNOBS, Knob, values_at_checkpoint


KNOB_SPECS: dict[str, Knob] = KNOBS
"""The knob table (`engine.control.knob_table.KNOBS`, the same dict): kind, range, owner, followers, boundary, refusal,
preview, config and checkpoint paths, dashboard key."""
KnobSpec = Knob

ACTIONS: dict[str, str] = {"checkpoint": "trainer", "stop": "trainer"}
"""One-shot actions and their consumer (taken at the trainer's next local-step boundary)."""


class KnobError(ValueError):
    """A knob value that cannot be accepted; the message says why."""


def validate_knob_value(name: str, value: Any) -> Any:
    """Check `value` against the knob's type and inclusive range; returns the normalised value.

    Raises `KnobError` with a reason (unknown knob, wrong type, out of range).
    """
    spec = KNOB_SPECS.get(name)
    if spec is None:
        raise KnobError(f"unknown knob {name!r}; known knobs: {', '.join(KNOB_SPECS)}")
    if spec.kind is bool:
        if not isinstance(value, bool):
            raise KnobError(f"{name} must be true or false, got {value!r}")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise KnobError(f"{name} must be {spec.range_text()}, got {type(value).__name__} {value!r}")
    if spec.kind is int:
        if isinstance(value, float) and not value.is_integer():
            raise KnobError(f"{name} must be an integer, got {value!r}")
        value = int(value)
    else:
        value = float(value)
        if not math.isfinite(value):
            raise KnobError(f"{name} must be finite, got {value!r}")
    assert spec.low is not None and spec.high is not None
    if not spec.low <= value <= spec.high:
        raise KnobError(f"{name}={value:g} is out of range: must be {spec.range_text()}")
    return value


_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def parse_knob_value(name: str, text: str) -> Any:
    """Parse user text (CLI argument, TUI input) into a validated knob value; raises `KnobError`."""
    spec = KNOB_SPECS.get(name)
    if spec is None:
        raise KnobError(f"unknown knob {name!r}; known knobs: {', '.join(KNOB_SPECS)}")
    raw = text.strip()
    if spec.kind is bool:
        if raw.lower() in _TRUE:
            return True
        if raw.lower() in _FALSE:
            return False
        raise KnobError(f"{name} must be true or false, got {raw!r}")
    try:
        number: int | float = int(raw) if spec.kind is int else float(raw)
    except ValueError:
        raise KnobError(f"{name} must be {spec.range_text()}, got {raw!r}") from None
    return validate_knob_value(name, number)


@dataclass
class KnobRequest:
    value: Any
    who: str
    time: float
    step: int | None


@dataclass
class KnobState:
    """Desired and applied value of one knob, plus the unacknowledged requests by version."""

    value: Any
    applied_value: Any
    version: int = 0
    applied_version: int = 0
    applied_at_step: int | None = None
    requests: dict[int, KnobRequest] = field(default_factory=dict)

    @property
    def pending(self) -> bool:
        return self.version > self.applied_version


def sync_mode_of(config: dict[str, Any]) -> bool:
    """Whether a config dict runs in sync mode (`async_training.mode = "sync"`)."""
    section = config.get("async_training")
    return isinstance(section, dict) and section.get("mode") == "sync"


def knobs_at_checkpoint(state: dict[str, Any] | None, config: dict[str, Any]) -> dict[str, Any]:
    """On resume: the values in force at the checkpoint (`engine.control.knob_table.values_at_checkpoint`), which win over
    the run file's; empty for a fresh run."""
    return values_at_checkpoint(state, sync_mode_of(config)) if state else {}


def initial_knobs(config: dict[str, Any], resumed: dict[str, Any] | None = None) -> dict[str, KnobState]:
    """Knob states at the start of a run: the value a resumed checkpoint had in force (`resumed`), else the
    config's where it sets one, else the default. A value that does not validate falls back to the next source."""
    states: dict[str, KnobState] = {}
    for name, spec in KNOB_SPECS.items():
        value: Any = spec.default
        node: Any = config
        for key in spec.config_path or ():
            node = node.get(key) if isinstance(node, dict) else None
        candidates = [(resumed or {}).get(name), node if spec.config_path else None]
        for candidate in candidates:
            if candidate is None:
                continue
            try:
                value = validate_knob_value(name, candidate)
                break
            except KnobError:
                continue
        states[name] = KnobState(value=value, applied_value=value)
    return states


def knob_view(name: str, st: KnobState, last: KnobRequest | None) -> dict[str, Any]:
    """The public view of one knob, as returned by `get_knobs()` and in snapshots."""
    spec = KNOB_SPECS[name]
    return {
        "value": st.value,
        "version": st.version,
        "pending": st.pending,
        "applied_value": st.applied_value,
        "applied_version": st.applied_version,
        "applied_at_step": st.applied_at_step,
        "requested_by": last.who if last else None,
        "requested_at": last.time if last else None,
        "requested_step": last.step if last else None,
        "type": spec.kind.__name__,
        "min": spec.low,
        "max": spec.high,
        "consumer": spec.owner,
        "followers": list(spec.followers),
    }
