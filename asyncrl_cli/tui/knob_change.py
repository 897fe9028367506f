"""What a knob change will do, in words, for the confirmation modal (pure; no Textual).

The budget follows verl's fully-async sizing: `required = ppo_mini_batch_size × require_batches` and
`max_required_samples = ⌊required × (1 + staleness_threshold) × trigger_parameter_sync_step⌋`
(`engine.loop.budget.max_required_samples`, the rule the rollouter runs), the most prompts the rollouter may
start per policy version (also the queue bound).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from asyncrl_cli.tui.format import fmt_value
from engine.control.knobs import KNOB_SPECS
from engine.loop.budget import max_required_samples


@dataclass
class KnobConfirmation:
    """What the confirmation modal of a knob change shows: its title, the old → new body and the warnings."""

    title: str
    body: str
    warnings: list[str] = field(default_factory=list)


def _section(config: dict[str, Any], name: str) -> dict[str, Any]:
    value = config.get(name)
    return value if isinstance(value, dict) else {}


def max_queue(config: dict[str, Any], staleness: float, trigger: int) -> int | None:
    """`max_required_samples` for these knob values; None when the config lacks the batch sizes."""
    mini = _section(config, "trainer").get("ppo_mini_batch_size")
    batches = _section(config, "async_training").get("require_batches", 1)
    if not isinstance(mini, int) or not isinstance(batches, int):
        return None
    return max_required_samples(mini * batches, staleness, trigger)


def describe_knob_change(
    name: str, old: Any, new: Any, config: dict[str, Any], knobs: dict[str, dict[str, Any]] | None = None
) -> KnobConfirmation:
    """Describe `name: old → new`, when it applies, its effect on the queue bound, and warnings."""
    spec = KNOB_SPECS[name]
    knobs = knobs or {}
    body = (
        f"{name}: {fmt_value(old)} → {fmt_value(new)}\nApplies {spec.applies}; shown as pending until then."
    )
    warnings: list[str] = []
    trigger = knobs.get("trigger_parameter_sync_step", {}).get("value")
    staleness = knobs.get("staleness_threshold", {}).get("value")
    if name == "trigger_parameter_sync_step" and isinstance(staleness, (int, float)):
        before, after = (
            max_queue(config, float(staleness), int(old)),
            max_queue(config, float(staleness), int(new)),
        )
        if before is not None and after is not None:
            body += f"\nPrompts per policy version (and queue bound): {before} → {after}."
        if new > old:
            warnings.append(
                f"syncs become rarer (every {new} local steps): each policy version trains on "
                f"rollouts from older weights, so off-policy drift and IS corrections grow"
            )
    if name == "staleness_threshold" and isinstance(trigger, int):
        before, after = max_queue(config, float(old), trigger), max_queue(config, float(new), trigger)
        if before is not None and after is not None:
            body += f"\nPrompts per policy version (and queue bound): {before} → {after}."
        if new == 0:
            warnings.append("0 means the rollouter produces exactly what one sync cycle consumes")
        elif new > old:
            warnings.append("more samples may be generated ahead of the trainer: staleness can grow")
    if name == "paused" and new:
        warnings.append("generation stops; the trainer drains the queue, then waits until you resume")
    verb = {"paused": "Pause generation" if new else "Resume generation"}.get(name, f"Change {name}")
    return KnobConfirmation(title=f"{verb}?", body=body, warnings=warnings)
