"""What a knob change will do, in words, for the confirmation modal (pure; no Textual): the knob table's preview.

The budget follows verl's fully-async sizing: `required = ppo_mini_batch_size × require_batches` and
`max_required_samples = ⌊required × (1 + staleness_threshold) × trigger_parameter_sync_step⌋`
(`engine.loop.budget.max_required_samples`, the rule the rollouter runs), the most prompts the rollouter may
start per policy version (also the queue bound).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any

from asyncrl_cli.tui.format import fmt_value
from engine.control.knob_table import KNOBS, PreviewContext
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


def required_samples(config: dict[str, Any]) -> int | None:
    """R = ppo_mini_batch_size × require_batches of a run's config dict; None when it lacks the batch sizes."""
    mini = _section(config, "trainer").get("ppo_mini_batch_size")
    batches = _section(config, "async_training").get("require_batches", 1)
    if not isinstance(mini, int) or not isinstance(batches, int):
        return None
    return mini * batches


def max_queue(config: dict[str, Any], staleness: float, trigger: int) -> int | None:
    """`max_required_samples` for these knob values; None when the config lacks the batch sizes."""
    r = required_samples(config)
    return None if r is None else max_required_samples(r, staleness, trigger)


def describe_knob_change(
    name: str, old: Any, new: Any, config: dict[str, Any], knobs: dict[str, dict[str, Any]] | None = None
) -> KnobConfirmation:
    """Describe `name: old → new`, when it applies and what it does: the knob's own pure preview
    (`engine.control.knob_table.Knob.preview`), given R from the config and the other knobs' values."""
    knob = KNOBS[name]
    values = {k: v.get("value") for k, v in (knobs or {}).items()}
    r = required_samples(config)
    bound = None if r is None else partial(max_required_samples, r)
    preview = knob.preview(old, new, PreviewContext(bound, values))
    body = "\n".join(
        [f"{name}: {fmt_value(old)} → {fmt_value(new)}", f"Applies {knob.applies}; shown as pending until then.",
         *preview.lines]
    )
    return KnobConfirmation(title=f"{knob.verb(new)}?", body=body, warnings=list(preview.warnings))
