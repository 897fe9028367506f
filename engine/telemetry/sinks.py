"""Metric and event sinks fed by the RunController.

A sink receives every metric record (one flat dict per trainer local step) and every event, in order.
`JsonlSink` is always on: it appends one JSON object per line to `<run_dir>/metrics.jsonl` and
`<run_dir>/events.jsonl`, line-buffered so a reader (the replay dashboard, `tail -f`) sees each record as
soon as it is written. TensorBoard and W&B sinks are optional: they are built only when named in
`logging.sinks` *and* their package is importable. With `logging.aggregate = "version"` they receive one
record per parameter version (`engine.telemetry.aggregate`), x-axis the version; metrics.jsonl and the
dashboard keep one record per step either way.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import IO, Any, Protocol, runtime_checkable

METRICS_FILE = "metrics.jsonl"
EVENTS_FILE = "events.jsonl"
CONFIG_FILE = "config.resolved.json"
PROVENANCE_FILE = "config.provenance.json"
"""Where each resolved value came from (file and line): written by `launch` and `launch --dry-run` alike."""
PLAN_FILE = "plan.json"
"""`launch --plan`: the predicted step time, samples/s and idle ratios the dashboard compares with the run."""
MACHINE_FILE = "machine.json"
"""A run with "auto" settings: the machine (CPU, ISA flags), the shapes timed, the times and each choice with
its rule (`engine.plan.auto.record`)."""


@runtime_checkable
class Sink(Protocol):
    """Receives metric records and events in the order the controller saw them."""

    def write_metrics(self, record: dict[str, Any]) -> None:
        """Write one metric record (flat dict; histograms are `{"edges": [...], "counts": [...]}`)."""

    def write_event(self, event: dict[str, Any]) -> None:
        """Write one event (`time`, `kind`, `step`, `version`, `message`, `level`, extra fields)."""

    def close(self) -> None:
        """Flush and release resources; further writes are ignored."""


def scalars_as_numbers(rec: dict[str, Any]) -> dict[str, Any]:
    """A record's tensor / numpy scalars as plain Python numbers (non-finite ones kept, unlike `to_jsonable`)."""
    return {k: v.item() if hasattr(v, "item") else v for k, v in rec.items()}


def to_jsonable(value: Any) -> Any:
    """Convert a record to plain JSON types.

    numpy / torch scalars become Python numbers (via `.item()`), tuples become lists, and non-finite floats
    become `None` so every line is strict JSON (readable by `jq`, not only by Python).
    """
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    item = getattr(value, "item", None)
    if callable(item):
        try:
            return to_jsonable(item())
        except (TypeError, ValueError):
            pass
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        return to_jsonable(tolist())
    return str(value)


def dumps_line(obj: dict[str, Any]) -> str:
    """One strict-JSON line (no trailing newline)."""
    return json.dumps(to_jsonable(obj), separators=(",", ":"), allow_nan=False)


class JsonlSink:
    """Appends records to `metrics.jsonl` and events to `events.jsonl` in `run_dir` (line-buffered).

    Files are opened in append mode, so a resumed run continues the same files.
    """

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._metrics: IO[str] | None = open(self.run_dir / METRICS_FILE, "a", buffering=1, encoding="utf-8")
        self._events: IO[str] | None = open(self.run_dir / EVENTS_FILE, "a", buffering=1, encoding="utf-8")

    def write_metrics(self, record: dict[str, Any]) -> None:
        if self._metrics is not None:
            self._metrics.write(dumps_line(record) + "\n")

    def write_event(self, event: dict[str, Any]) -> None:
        if self._events is not None:
            self._events.write(dumps_line(event) + "\n")

    def close(self) -> None:
        for handle in (self._metrics, self._events):
            if handle is not None:
                handle.close()
        self._metrics = self._events = None


def scalar_items(record: dict[str, Any]) -> list[tuple[str, float]]:
    """The numeric scalar entries of a record (bools and histograms excluded), for scalar-only sinks."""
    out: list[tuple[str, float]] = []
    for key, value in record.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if isinstance(value, float) and not math.isfinite(value):
            continue
        out.append((key, float(value)))
    return out


def build_sinks(
    run_dir: str | Path | None,
    names: list[str] | tuple[str, ...] = ("jsonl",),
    run_name: str = "run",
    project: str = "asyncrl",
    config: dict[str, Any] | None = None,
    aggregate: str = "step",
) -> list[Sink]:
    """Build the sinks named in `logging.sinks`.

    `jsonl` is always included when `run_dir` is set. `tensorboard` / `wandb` are included only when their
    package imports; otherwise they are skipped (the caller can report `missing_sinks(names)`).
    `console` is the driver's progress line and is not a controller sink. `aggregate`: the x-axis and record
    rate of TensorBoard / W&B — "step" (one record per local step) or "version" (one per parameter version).
    """
    from engine.telemetry.aggregate import AGGREGATES, STEP_KEY, VERSION_KEY, VersionAggregatingSink

    if aggregate not in AGGREGATES:
        raise ValueError(f"logging.aggregate must be one of {AGGREGATES}, got {aggregate!r}")
    step_key = VERSION_KEY if aggregate == "version" else STEP_KEY

    def tracked(sink: Sink) -> Sink:
        return VersionAggregatingSink(sink) if aggregate == "version" else sink

    sinks: list[Sink] = []
    if run_dir is not None:
        sinks.append(JsonlSink(run_dir))
    if "tensorboard" in names and run_dir is not None:
        from engine.telemetry.tensorboard_sink import TensorBoardSink, tensorboard_available

        if tensorboard_available():
            sinks.append(tracked(TensorBoardSink(Path(run_dir) / "tensorboard", step_key=step_key)))
    if "wandb" in names:
        from engine.telemetry.wandb_sink import WandbSink, wandb_available

        if wandb_available():
            sinks.append(tracked(WandbSink(project=project, run_name=run_name, config=config or {}, run_dir=run_dir,
                                           step_key=step_key)))
    return sinks


def missing_sinks(names: list[str] | tuple[str, ...]) -> list[str]:
    """Sinks requested in `logging.sinks` whose package is not installed."""
    missing: list[str] = []
    if "tensorboard" in names:
        from engine.telemetry.tensorboard_sink import tensorboard_available

        if not tensorboard_available():
            missing.append("tensorboard")
    if "wandb" in names:
        from engine.telemetry.wandb_sink import wandb_available

        if not wandb_available():
            missing.append("wandb")
    return missing
