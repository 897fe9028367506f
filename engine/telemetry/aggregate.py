"""Metric records per parameter version (`logging.aggregate = "version"`), as verl's fully-async trainer logs.

The trainer writes one record per local step. verl logs once per parameter version instead: its
`MetricsAggregator` collects the step metrics of one sync cycle and logs them at the sync with
`step = current_param_version` (the version the cycle produced), so curves of runs with different
`trigger_parameter_sync_step` share an x-axis. `VersionAggregator` does the same for the TensorBoard and
W&B sinks (`metrics.jsonl` and the dashboard keep every step):

* a cycle ends with the step that synced (its record carries `timing_s/param_sync`, and the new version in
  `fully_async/count/current_param_version`); the aggregate is emitted then, at x = that version. Steps left
  after the last sync are emitted by `flush()` at x = their version + 1.
* per name, verl's rules: `timing_s/*` summed; counters (`fully_async/count/*`, `training/global_step`,
  cumulative `asyncrl/*` counters) take the last value; otherwise by name — `mean`/`avg` → mean, `max` → max,
  `min` → min, `sum`/`total` → sum, anything else the mean of the per-step values. `fully_async/trainer/idle_ratio`
  is recomputed as Σ timing_s/gen / Σ timing_s/step. Histograms add their counts when the edges agree (else
  the last one is kept).
* a record that is not a trainer step (validation: it has `val-core/*` keys) passes through at once, at its
  own version.
"""

from __future__ import annotations

import math
from typing import Any

STEP_KEY = "training/global_step"
VERSION_KEY = "fully_async/count/current_param_version"
SYNC_MARKER = "timing_s/param_sync"
AGGREGATES = ("step", "version")

_LAST = {STEP_KEY, "asyncrl/time", "asyncrl/total_steps", "asyncrl/trainer/world_size", "asyncrl/sync_interval",
         "asyncrl/staleness/bound", "asyncrl/reward/errors", "actor/optimizer_step", "training/epoch"}
_LAST_PREFIXES = ("fully_async/count/", "asyncrl/count/")


def rule_of(name: str) -> str:
    """How `name` is combined over a version: "sum", "last", "mean", "max" or "min" (see the docstring)."""
    if name in _LAST or name.startswith(_LAST_PREFIXES):
        return "last"
    low = name.lower()
    if "timing_s/" in low:
        return "sum"
    for keys, rule in ((("mean", "avg", "average"), "mean"), (("max",), "max"), (("min",), "min"),
                       (("sum", "total"), "sum")):
        if any(k in low for k in keys):
            return rule
    return "mean"


def _is_hist(value: Any) -> bool:
    return isinstance(value, dict) and "edges" in value and "counts" in value


def _combine(name: str, values: list[Any]) -> Any:
    if _is_hist(values[-1]):
        hists = [v for v in values if _is_hist(v)]
        if all(h["edges"] == hists[-1]["edges"] for h in hists):
            return {"edges": hists[-1]["edges"], "counts": [sum(c) for c in zip(*(h["counts"] for h in hists))]}
        return hists[-1]
    nums = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)
            and math.isfinite(float(v))]
    if not nums:
        return values[-1]
    rule = rule_of(name)
    if rule == "last":
        return values[-1]
    if rule == "sum":
        return sum(nums)
    if rule == "max":
        return max(nums)
    if rule == "min":
        return min(nums)
    return sum(nums) / len(nums)


def aggregate_records(records: list[dict[str, Any]]) -> dict[str, Any]:
    """One record from the step records of a version (rules in the module docstring)."""
    names: dict[str, None] = {}
    for r in records:
        names.update(dict.fromkeys(r))
    out = {n: _combine(n, [r[n] for r in records if n in r]) for n in names}
    gen, step = out.get("timing_s/gen"), out.get("timing_s/step")
    if isinstance(gen, float) and isinstance(step, float) and step > 0:
        out["fully_async/trainer/idle_ratio"] = gen / step
    out["asyncrl/steps_in_version"] = len(records)
    return out


class VersionAggregator:
    """Turns per-step records into per-version ones (see the module docstring). `add` returns the records
    ready to be written (none while a cycle is open), `flush` the rest at the end of the run."""

    def __init__(self) -> None:
        self._pending: list[dict[str, Any]] = []

    def add(self, record: dict[str, Any]) -> list[dict[str, Any]]:
        if any(k.startswith("val-core/") for k in record):
            return [dict(record)]
        self._pending.append(record)
        if SYNC_MARKER not in record:
            return []
        return [self._emit(int(record.get(VERSION_KEY) or 0))]

    def flush(self) -> list[dict[str, Any]]:
        if not self._pending:
            return []
        return [self._emit(int(self._pending[-1].get(VERSION_KEY) or 0) + 1)]

    def _emit(self, version: int) -> dict[str, Any]:
        out = aggregate_records(self._pending)
        out[VERSION_KEY] = version
        self._pending = []
        return out


class VersionAggregatingSink:
    """A sink wrapper: the inner sink (built with `step_key = VERSION_KEY`) receives one record per version."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.aggregator = VersionAggregator()

    def write_metrics(self, record: dict[str, Any]) -> None:
        for rec in self.aggregator.add(record):
            self.inner.write_metrics(rec)

    def write_event(self, event: dict[str, Any]) -> None:
        self.inner.write_event(event)

    def close(self) -> None:
        for rec in self.aggregator.flush():
            self.inner.write_metrics(rec)
        self.inner.close()
