"""The dashboard's data model: folds `snapshot(since)` deltas into bounded history (pure, no Textual).

Series use the local step `training/global_step` as x. Sync fields (`asyncrl/sync/*`) only appear on steps
that synced, so `latest(key)` looks back for the most recent record that has the key.
ETA = (total − step) × elapsed / step (mean wall time per local step so far).
Plan drift = measured step time ÷ planned step time − 1 (the plan comes with the run info of `launch --plan`).
Validation: the newest record's verl core accuracy `val-core/<source>/acc/mean@n` (n answers per prompt).
"""

from __future__ import annotations

from collections import deque
from typing import Any

from asyncrl_cli.tui.format import is_number

STEP = "training/global_step"
VERSION = "fully_async/count/current_param_version"
TRAINER_TPS = "asyncrl/trainer/tokens_per_s"
ROLLOUT_TPS = "asyncrl/rollout/tokens_per_s"
QUEUE = "fully_async/monitor/queue/mq_queue_size"
STALE_MEAN = "asyncrl/staleness/mean"
STALE_MAX = "asyncrl/staleness/max"
STALE_BOUND = "asyncrl/staleness/bound"
# token importance ratio π_train/π_rollout, reported every step whether or not IS weights are applied
IS_MEAN = "asyncrl/is_ratio/mean"
IS_MIN = "asyncrl/is_ratio/min"
IS_MAX = "asyncrl/is_ratio/max"
IS_CLIP = "rollout_corr/rollout_is_ratio_fraction_high"
RS_MASK = "rollout_corr/rollout_rs_masked_fraction"
ESS = "rollout_corr/rollout_is_eff_sample_size"
REWARD = "critic/rewards/mean"
SCORE = "critic/score/mean"
SYNC_PAUSE = "asyncrl/sync/pause_s"
SYNC_TRANSFER = "asyncrl/sync/transfer_s"
IS_HIST = "asyncrl/is_hist"
STALE_HIST = "asyncrl/staleness_hist"
SYNC_KNOB = "trigger_parameter_sync_step"
STEP_TIME = "timing_s/step"


class DashboardModel:
    """Everything the widgets render, rebuilt incrementally from snapshots."""

    def __init__(self, history: int = 400, max_events: int = 2000) -> None:
        self.history = history
        self.cursor = 0
        self.received = False
        self.metrics: deque[dict[str, Any]] = deque(maxlen=history)
        self.events: deque[dict[str, Any]] = deque(maxlen=max_events)
        self.knobs: dict[str, dict[str, Any]] = {}
        self.workers: dict[str, dict[str, Any]] = {}
        self.run: dict[str, Any] = {}
        self.state = "connecting"
        self.now: float | None = None
        self.connected = True
        self.error: str | None = None
        self.failures = 0

    def reset(self) -> None:
        """Forget all history (the controller restarted: its cursor went backwards)."""
        self.__init__(self.history, self.events.maxlen or 2000)  # type: ignore[misc]

    def apply(self, snap: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]], bool]:
        """Fold one (possibly merged) snapshot delta in.

        Returns `(new metrics, new events, changed)`; `changed` is False when the snapshot carried nothing
        new (same knobs, workers, state, run info and clock), so the UI can skip redrawing.
        """
        new_metrics = list(snap.get("metrics") or [])
        new_events = list(snap.get("events") or [])
        knobs = dict(snap.get("knobs") or {})
        workers = dict(snap.get("workers") or {})
        run = dict(snap.get("run") or {})
        state = str(snap.get("state", self.state))
        now = snap.get("now", self.now)
        changed = (
            bool(new_metrics or new_events)
            or not self.received
            or not self.connected
            or (
                (knobs, workers, run, state, now)
                != (self.knobs, self.workers, self.run, self.state, self.now)
            )
        )
        self.metrics.extend(new_metrics)
        self.events.extend(new_events)
        self.cursor = int(snap.get("cursor", self.cursor))
        self.knobs, self.workers, self.run, self.state, self.now = knobs, workers, run, state, now
        self.received = True
        self.connected, self.error, self.failures = True, None, 0
        return new_metrics, new_events, changed

    def mark_failed(self, error: str) -> None:
        """The last poll raised: keep the data, flag the disconnection."""
        self.connected, self.error = False, error
        self.failures += 1

    # ------------------------------------------------------------------------------------ reads

    def latest(self, key: str) -> Any:
        """The value of `key` in the most recent record that has a non-null one (None if none)."""
        for record in reversed(self.metrics):
            value = record.get(key)
            if value is not None:
                return value
        return None

    def series(self, key: str) -> tuple[list[float], list[float]]:
        """`(steps, values)` of `key` over the kept history, skipping records without a number."""
        xs: list[float] = []
        ys: list[float] = []
        for record in self.metrics:
            x, y = record.get(STEP), record.get(key)
            if is_number(x) and is_number(y):
                xs.append(float(x))
                ys.append(float(y))
        return xs, ys

    def histogram(self, key: str, window: int = 5) -> tuple[list[float], list[float]] | None:
        """Bin edges and counts summed over the latest `window` records whose histogram has the same edges."""
        edges: list[float] | None = None
        counts: list[float] = []
        seen = 0
        for record in reversed(self.metrics):
            hist = record.get(key)
            if not isinstance(hist, dict) or "edges" not in hist or "counts" not in hist:
                continue
            these = list(hist["edges"])
            if edges is None:
                edges, counts = these, [float(c) for c in hist["counts"]]
            elif these[: len(edges)] == edges or edges[: len(these)] == these:
                # bins that only extend each other (e.g. staleness 0..1 vs 0..2) merge on the longer edges
                if len(these) > len(edges):
                    edges, counts = these, counts + [0.0] * (len(these) - 1 - len(counts))
                other = [float(c) for c in hist["counts"]] + [0.0] * (len(counts) - len(hist["counts"]))
                counts = [a + b for a, b in zip(counts, other, strict=True)]
            else:
                break
            seen += 1
            if seen >= window:
                break
        if edges is None or len(edges) != len(counts) + 1:
            return None
        return edges, counts

    @property
    def step(self) -> int | None:
        value = self.latest(STEP)
        return int(value) if is_number(value) else None

    @property
    def policy_version(self) -> int | None:
        """The newest policy version: from the metrics, or the latest `sync` event if newer."""
        candidates = [self.latest(VERSION)]
        candidates += [e.get("version") for e in reversed(self.events) if e.get("kind") == "sync"][:1]
        numbers = [int(v) for v in candidates if is_number(v)]
        return max(numbers) if numbers else None

    @property
    def total_steps(self) -> int | None:
        """From the run info, else the engine's `asyncrl/total_steps` metric."""
        value = self.run.get("total_steps")
        if not is_number(value):
            value = self.latest("asyncrl/total_steps")
        return int(value) if is_number(value) else None

    @property
    def elapsed(self) -> float | None:
        start = self.run.get("started_at")
        if is_number(start) and is_number(self.now):
            return max(0.0, float(self.now) - float(start))
        return None

    @property
    def eta(self) -> float | None:
        """Seconds left at the mean pace so far; 0 once the step count is reached."""
        step, total, elapsed = self.step, self.total_steps, self.elapsed
        if step is None or total is None or elapsed is None or step <= 0:
            return None
        return max(0, total - step) * elapsed / step

    def step_time(self, window: int = 20) -> float | None:
        """Measured wall time per step (`timing_s/step`, waits and syncs included): the mean of the last
        `window` steps that report it, the same quantity `asyncrl plan` predicts as its step time."""
        values = [float(r[STEP_TIME]) for r in self.metrics if is_number(r.get(STEP_TIME))][-window:]
        return sum(values) / len(values) if values else None

    def planned_step_time(self) -> float | None:
        """The plan's predicted step time when the run was launched with `--plan`, else None."""
        value = (self.run.get("plan") or {}).get("step_time_s")
        return float(value) if is_number(value) and value > 0 else None

    def worker_rows(self) -> list[dict[str, Any]]:
        """Workers with canonical fields, trainer ranks first: `role` (or the engine's `kind`),
        `weight_version` (or `version`), and `lag = policy_version − weight_version` when not reported."""
        policy = self.policy_version
        rows = []
        for row in self.workers.values():
            out = dict(row)
            out["role"] = row.get("role") or row.get("kind")
            version = row.get("weight_version", row.get("version"))
            out["weight_version"] = version
            if out.get("lag") is None and is_number(version) and policy is not None:
                out["lag"] = max(0, policy - int(version))
            rows.append(out)
        return sorted(rows, key=lambda r: (r.get("role") != "trainer", str(r.get("id"))))

    def knob(self, name: str) -> dict[str, Any]:
        return self.knobs.get(name, {})

    def validation(self) -> tuple[float, int] | None:
        """(accuracy, n) of the newest validation record in the history: its `val-core/<source>/acc/mean@n`
        (else `…/reward/mean@n`: verl's core mean over the n answers per prompt), averaged over its data
        sources; None before the first validation."""
        from engine.telemetry.val_curve import core_accuracy_key

        for rec in reversed(self.metrics):
            if not any(k.startswith("val-core/") for k in rec):
                continue
            best: dict[str, tuple[int, float, int]] = {}
            for key, value in rec.items():
                found = core_accuracy_key(key) if is_number(value) else None
                if found is not None and (found[0] not in best or found[1] < best[found[0]][0]):
                    best[found[0]] = (found[1], float(value), found[2])
            if best:
                values = [v for _, v, _ in best.values()]
                return sum(values) / len(values), max(n for _, _, n in best.values())
        return None

    def sync_interval(self) -> tuple[Any, bool, Any]:
        """`(applied value, pending?, requested value)` of `trigger_parameter_sync_step`."""
        knob = self.knob(SYNC_KNOB)
        applied = knob.get("applied_value", self.latest("asyncrl/sync_interval"))
        return applied, bool(knob.get("pending")), knob.get("value")
