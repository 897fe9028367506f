"""The knob table: every live-tunable setting, written once.

A knob is a setting the operator changes while the run goes (`asyncrl ctl RUN set`, the dashboard). Its
`Knob` record says everything any part of the system needs to know about it:

| field          | what it says                                         | who reads it                                    |
|----------------|------------------------------------------------------|-------------------------------------------------|
| `kind`, range  | int / float / bool, inclusive `[low, high]`          | validation (`engine.control.knobs`): the controller, `ctl`, the dashboard's input |
| `default`, `config_path` | the value at the start of a run              | the controller's table, the config schema       |
| `owner`        | the core that applies a change and acknowledges it   | the router (`engine.loop.knobs.KnobInbox`)      |
| `followers`    | cores that read the value in force once applied      | the router                                      |
| `boundary`     | when the owner applies it: "now", or "step" (the trainer's next local-step boundary; "sync" in sync mode) | the owner core, the help texts |
| `sync_refusal` | why a change cannot apply in sync mode (None: it can) | the router (a refused change is never acknowledged) |
| `preview`      | pure `(old, new, PreviewContext) → Preview`: what the change does | the dashboard's confirmation |
| `state_path`   | where a checkpoint's state holds the value in force  | resume: the controller's table starts from it   |
| `key`, `title`, `verbs` | the dashboard key, input title, toggle verbs | the dashboard (keys, help, command palette) and `ctl` |

Adding a knob = adding a record to `KNOBS` plus the code in its owner core that applies it (and, for resume, that
checkpoints it under `state_path`); `ctl`, the dashboard, the controller and resume iterate over the table, and
the loop's router (`engine.loop.knobs`) routes by it.

| knob                          | owner (applies, acks)                           | followers (read the value in force) |
|-------------------------------|-------------------------------------------------|-------------------------------------|
| `trigger_parameter_sync_step` | trainer: at its next local-step boundary; in sync mode at its next sync (acknowledged just before the sync's weights go out) | rollouter: its budget (in sync mode it takes the value at that sync) |
| `staleness_threshold`         | rollouter: at once, in the staleness budget; refused in sync mode (the budget is 0 there) | trainer: the `asyncrl/staleness/bound` it reports |
| `paused`                      | rollouter: at once                                | — |

Pure Python and a leaf of the control package (it imports no other engine package), so the loop cores, the
controller, the CLI and the dashboard can all read it.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

TRAINER = "trainer"
ROLLOUTER = "rollouter"


@dataclass(frozen=True)
class PreviewContext:
    """What a preview may look at: `queue_bound(s, N)`, the run's `max_required_samples = ⌊R·(1+s)·N⌋`
    (`engine.loop.budget`, bound to this run's R; None when R is unknown), and the values in force of the knobs."""

    queue_bound: Callable[[float, int], int] | None = None
    values: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Preview:
    """What a change does, in words: lines for the confirmation's body and warnings."""

    lines: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()


def no_preview(old: Any, new: Any, ctx: PreviewContext) -> Preview:
    return Preview()


@dataclass(frozen=True)
class Knob:
    """A runtime-tunable setting (see the module docstring for what each field is for)."""

    name: str
    kind: type
    low: float | None
    high: float | None
    default: Any
    owner: str
    followers: tuple[str, ...] = ()
    boundary: str = "now"
    """"now" (at once) or "step" (the trainer's next local-step boundary; in sync mode its next sync)."""
    applies: str = ""
    """When it applies, in words (`applies {applies}`)."""
    description: str = ""
    config_path: tuple[str, ...] | None = None
    state_path: tuple[str, ...] | None = None
    """Where the value in force lies in a checkpoint's state (`state.json`); None: a resume starts from the config."""
    sync_refusal: str | None = None
    preview: Callable[[Any, Any, PreviewContext], Preview] = no_preview
    key: str | None = None
    """The dashboard key that changes it (None: `ctl` and the command palette only)."""
    key_label: str = ""
    title: str = ""
    """The dashboard's input title (numbers) or, for a bool, what the footer calls the toggle."""
    verbs: tuple[str, str] = ("", "")
    """A bool knob's (set false, set true) verbs, e.g. ("Resume generation", "Pause generation")."""

    @property
    def consumer(self) -> str:
        return self.owner

    def range_text(self) -> str:
        """Human form of the accepted values, e.g. `an integer in [1, 1000]`."""
        if self.kind is bool:
            return "true or false"
        noun = "an integer" if self.kind is int else "a number"
        return f"{noun} in [{self.low:g}, {self.high:g}]"

    def verb(self, new: Any) -> str:
        """The title of a change to `new`: a bool's verb, else `Change NAME`."""
        if self.kind is bool:
            off, on = self.verbs
            return (on or f"Turn {self.name} on") if new else (off or f"Turn {self.name} off")
        return f"Change {self.name}"

    def label(self) -> str:
        """Short name for menus: the title without its parenthesis, else the knob's name."""
        return (self.title.split(" (")[0] or self.name) if self.title else self.name


def _queue_line(ctx: PreviewContext, before: tuple[float, int], after: tuple[float, int]) -> tuple[str, ...]:
    if ctx.queue_bound is None:
        return ()
    b, a = (ctx.queue_bound(s, n) for s, n in (before, after))
    return (f"Prompts per policy version (and queue bound): {b} → {a}.",)


def preview_sync_interval(old: Any, new: Any, ctx: PreviewContext) -> Preview:
    """The queue bound max_required_samples = ⌊R·(1+s)·N⌋ before and after; rarer syncs warn of drift."""
    s = ctx.values.get("staleness_threshold")
    lines = _queue_line(ctx, (float(s), int(old)), (float(s), int(new))) if isinstance(s, (int, float)) else ()
    warnings = ((f"syncs become rarer (every {new} local steps): each policy version trains on rollouts from "
                 "older weights, so off-policy drift and IS corrections grow"),) if new > old else ()
    return Preview(lines, warnings)


def preview_staleness(old: Any, new: Any, ctx: PreviewContext) -> Preview:
    """The queue bound before and after; 0 = exactly one sync cycle, more = staleness can grow."""
    n = ctx.values.get("trigger_parameter_sync_step")
    lines = _queue_line(ctx, (float(old), n), (float(new), n)) if isinstance(n, int) else ()
    if new == 0:
        warnings: tuple[str, ...] = ("0 means the rollouter produces exactly what one sync cycle consumes",)
    elif new > old:
        warnings = ("more samples may be generated ahead of the trainer: staleness can grow",)
    else:
        warnings = ()
    return Preview(lines, warnings)


def preview_paused(old: Any, new: Any, ctx: PreviewContext) -> Preview:
    return Preview(warnings=("generation stops; the trainer drains the queue, then waits until you resume",) if new
                   else ())


KNOBS: dict[str, Knob] = {
    k.name: k
    for k in (
        Knob(
            "trigger_parameter_sync_step", int, 1, 1000, 4, TRAINER, followers=(ROLLOUTER,), boundary="step",
            applies="at the trainer's next local-step boundary (sync mode: at the next sync)",
            description="local trainer steps between weight syncs (one policy version per sync)",
            config_path=("async_training", "trigger_parameter_sync_step"), state_path=("trigger",),
            preview=preview_sync_interval, key="s", key_label="Sync interval",
            title="Sync interval (local trainer steps per weight sync)",
        ),
        Knob(
            "staleness_threshold", float, 0.0, 10.0, 0.1, ROLLOUTER, followers=(TRAINER,),
            applies="at once, in the rollouter's staleness budget",
            description="extra fraction of samples the rollouter may generate ahead of the trainer per sync",
            config_path=("async_training", "staleness_threshold"), state_path=("rollout", "staleness_threshold"),
            sync_refusal='async_training.mode = "sync" keeps the staleness budget at 0; staleness_threshold has no '
                         "effect",
            preview=preview_staleness, key="t", key_label="Staleness", title="Staleness threshold",
        ),
        Knob(
            "paused", bool, None, None, False, ROLLOUTER,
            applies="by the rollouter within one generation step",
            description="pause (true) or resume (false) generation; the trainer drains the queue",
            preview=preview_paused, key="p", key_label="Pause/resume", title="Pause generation",
            verbs=("Resume generation", "Pause generation"),
        ),
    )
}
"""The knob table. Tests may extend it in-process (`monkeypatch.setitem(KNOBS, ...)`): every reader looks it up
at call time."""


def boundary(name: str, sync_mode: bool) -> str:
    """When the owner applies `name`: a "step" knob waits for the next sync in sync mode."""
    b = KNOBS[name].boundary
    return "sync" if b == "step" and sync_mode else b


def refusal(name: str, sync_mode: bool) -> str | None:
    """Why a live change of `name` cannot apply in this run (None: it can)."""
    knob = KNOBS.get(name)
    if knob is None:
        return f"no loop core takes knob {name!r}"
    return knob.sync_refusal if sync_mode else None


def values_at_checkpoint(state: Mapping[str, Any], sync_mode: bool) -> dict[str, Any]:
    """The value in force at a checkpoint of every knob its owner checkpoints (`state_path`), except those refused
    in this run's mode (in sync mode the staleness budget is 0 whatever the checkpoint says)."""
    out: dict[str, Any] = {}
    for name, knob in KNOBS.items():
        node: Any = state
        for key in knob.state_path or ():
            node = node.get(key) if isinstance(node, Mapping) else None
        if knob.state_path and node is not None and refusal(name, sync_mode) is None:
            out[name] = node
    return out
