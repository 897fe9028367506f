"""`ReplaySource`: serve a run directory as if it were a live controller (read-only).

It reads `metrics.jsonl`, `events.jsonl` and `config.resolved.json` and tails the two JSONL files (only
complete lines are consumed, so a line being written is picked up on the next call). Knobs are rebuilt
from the config plus the `knob` events; the worker table from the latest metrics and `replica`/`sync`
events; the state from the `finish` event.
"""

from __future__ import annotations

import bisect
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.control.errors import RunNotFoundError
from engine.control.core import STEP_KEY, TIME_KEY, VERSION_KEY
from engine.control.knobs import KnobRequest, KnobState, initial_knobs, knob_view
from engine.telemetry.sinks import CONFIG_FILE, EVENTS_FILE, METRICS_FILE, PLAN_FILE, PROVENANCE_FILE

REPLAY_REASON = "replay is read-only: changes are disabled"
_EVENT_FIELDS = ("kind", "message", "level", "time", "worker", "step", "version")
_PHASE_STATE = {"restart": "restarting", "replaced": "running", "exhausted": "failed"}
"""Worker state implied by the `phase` of the engine's `replica` events (when they carry no `state`)."""


def load_resolved_config(run_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """`(config, provenance)` from `config.resolved.json`.

    Accepted shapes: `{"config": {...}, "provenance": {...}}`, or the plain config (then provenance comes
    from a `provenance` key inside it or from the sibling `config.provenance.json`, else it is empty).
    """
    path = run_dir / CONFIG_FILE
    if not path.is_file():
        return {}, {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}, {}
    if not isinstance(data, dict):
        return {}, {}
    if isinstance(data.get("config"), dict):
        return data["config"], dict(data.get("provenance") or {})
    config = dict(data)
    provenance = config.pop("provenance", None)
    if not isinstance(provenance, dict):
        side = run_dir / PROVENANCE_FILE
        try:
            provenance = json.loads(side.read_text(encoding="utf-8")) if side.is_file() else {}
        except (OSError, json.JSONDecodeError):
            provenance = {}
    return config, provenance if isinstance(provenance, dict) else {}


def _load_plan(run_dir: Path) -> dict[str, Any] | None:
    """The run's `plan.json` (written by `launch --plan`), or None when absent or unreadable."""
    try:
        data = json.loads((run_dir / PLAN_FILE).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


class _Tail:
    """Reads the complete new lines of a growing JSONL file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.bad_lines = 0

    def read_new(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                chunk = handle.read()
        except FileNotFoundError:
            return []
        end = chunk.rfind(b"\n")
        if end < 0:
            return []
        self.offset += end + 1
        out: list[dict[str, Any]] = []
        for line in chunk[: end + 1].splitlines():
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                self.bad_lines += 1
                continue
            if isinstance(obj, dict):
                out.append(obj)
            else:
                self.bad_lines += 1
        return out


class ReplaySource:
    """A read-only `MetricsSource` over a run directory."""

    read_only = True

    def __init__(
        self, run_dir: str | Path, *, clock: Callable[[], float] = time.time, live_window_s: float = 60.0
    ) -> None:
        self.run_dir = Path(run_dir)
        if not self.run_dir.is_dir():
            raise RunNotFoundError(f"run directory {str(run_dir)!r} does not exist")
        if not (self.run_dir / METRICS_FILE).is_file() and not (self.run_dir / EVENTS_FILE).is_file():
            raise RunNotFoundError(
                f"{str(run_dir)!r} has no {METRICS_FILE} or {EVENTS_FILE}: is it a run directory?"
            )
        self.label = f"replay {self.run_dir}"
        self._clock = clock
        self._live_window_s = live_window_s
        self.config, self.provenance = load_resolved_config(self.run_dir)
        self.prediction = _load_plan(self.run_dir)
        self._metrics_tail = _Tail(self.run_dir / METRICS_FILE)
        self._events_tail = _Tail(self.run_dir / EVENTS_FILE)
        self._seq = 0
        self._metric_seqs: list[int] = []
        self._metrics: list[dict[str, Any]] = []
        self._event_seqs: list[int] = []
        self._events: list[dict[str, Any]] = []
        self._knobs: dict[str, KnobState] = initial_knobs(self.config)
        self._last_request: dict[str, KnobRequest] = {}
        self._replicas: dict[str, dict[str, Any]] = {}
        self._last_sync_version: int | None = None
        self._start: dict[str, Any] | None = None
        self._finish: dict[str, Any] | None = None
        self._paused = False

    @property
    def bad_lines(self) -> int:
        """Lines that were not JSON objects (skipped)."""
        return self._metrics_tail.bad_lines + self._events_tail.bad_lines

    # ---------------------------------------------------------------------------------- ingest

    def _refresh(self) -> None:
        for record in self._metrics_tail.read_new():
            self._seq += 1
            self._metric_seqs.append(self._seq)
            self._metrics.append(record)
        for event in self._events_tail.read_new():
            self._seq += 1
            self._event_seqs.append(self._seq)
            self._events.append(event)
            self._fold_event(event)

    def _fold_event(self, ev: dict[str, Any]) -> None:
        kind = ev.get("kind")
        if kind == "start" and self._start is None:
            self._start = ev
        elif kind == "finish":
            self._finish = ev
        elif kind == "sync" and isinstance(ev.get("version"), int):
            self._last_sync_version = ev["version"]
            for row in self._replicas.values():
                if row.get("state") in (None, "running", "paused", "idle"):
                    row["weight_version"] = ev["version"]
                    row["last_seen"] = ev.get("time")
        elif kind == "replica" and (ev.get("worker") is not None or ev.get("replica") is not None):
            wid = str(ev["worker"]) if ev.get("worker") is not None else f"rollout-{ev['replica']}"
            row = self._replicas.setdefault(wid, {"id": wid, "role": "rollout"})
            row.update({k: v for k, v in ev.items() if k not in _EVENT_FIELDS})
            row["state"] = ev.get("state") or _PHASE_STATE.get(str(ev.get("phase")), row.get("state"))
            row["last_seen"] = ev.get("time")
        elif kind == "knob" and ev.get("knob") in self._knobs:
            self._fold_knob(ev)

    def _fold_knob(self, ev: dict[str, Any]) -> None:
        name, st = ev["knob"], self._knobs[ev["knob"]]
        version = ev.get("knob_version")
        if not isinstance(version, int):
            return
        if ev.get("phase") == "requested":
            req = KnobRequest(
                ev.get("new"),
                str(ev.get("who")),
                ev.get("requested_at") or ev.get("time") or 0.0,
                ev.get("requested_step"),
            )
            st.value, st.version = req.value, version
            st.requests[version] = req
            self._last_request[name] = req
        elif ev.get("phase") == "applied":
            st.applied_value, st.applied_version = ev.get("new"), version
            st.applied_at_step = ev.get("applied_step")
            st.requests = {v: r for v, r in st.requests.items() if v > version}
            st.version = max(st.version, version)
            if name == "paused":
                self._paused = bool(ev.get("new"))

    # ---------------------------------------------------------------------------------- views

    def _state(self) -> str:
        if self._finish is not None:
            declared = self._finish.get("state")
            if declared in ("finished", "failed"):
                return str(declared)
            return "failed" if self._finish.get("level") == "error" else "finished"
        if self._paused:
            return "paused"
        mtimes = [p.stat().st_mtime for p in (self._metrics_tail.path, self._events_tail.path) if p.is_file()]
        if mtimes and self._clock() - max(mtimes) <= self._live_window_s:
            return "running"
        return "stopped"

    def _started_at(self) -> float | None:
        if self._start is not None and isinstance(self._start.get("time"), (int, float)):
            return float(self._start["time"])
        times = [e["time"] for e in self._events[:1] if isinstance(e.get("time"), (int, float))]
        return float(times[0]) if times else None

    def _now(self, started_at: float | None) -> float | None:
        """The time of the latest item: last event time or start + last `asyncrl/time`."""
        candidates = [float(e["time"]) for e in self._events[-1:] if isinstance(e.get("time"), (int, float))]
        if (
            self._metrics
            and started_at is not None
            and isinstance(self._metrics[-1].get(TIME_KEY), (int, float))
        ):
            candidates.append(started_at + float(self._metrics[-1][TIME_KEY]))
        return max(candidates) if candidates else None

    def _total_steps(self) -> int | None:
        if self._start is not None and isinstance(self._start.get("total_steps"), int):
            return int(self._start["total_steps"])
        derived = self.config.get("derived")
        if isinstance(derived, dict) and isinstance(derived.get("total_local_steps"), int):
            return int(derived["total_local_steps"])
        return None

    def _workers(self, state: str, now: float | None) -> dict[str, dict[str, Any]]:
        """Trainer row from the latest metrics; one aggregate rollout row; a row per replica named in
        `replica` events (their `state`, or the state implied by their `phase`).

        Weight versions: the trainer holds max(metric version, last synced version); a replica holds the last
        version synced to it, and its lag is trainer version − replica version.
        """
        last = self._metrics[-1] if self._metrics else {}
        versions = [v for v in (last.get(VERSION_KEY), self._last_sync_version) if isinstance(v, int)]
        version = max(versions) if versions else None
        over = state in ("finished", "failed", "stopped")
        workers: dict[str, dict[str, Any]] = {
            "trainer": {
                "id": "trainer",
                "role": "trainer",
                "state": state,
                "tokens_per_s": last.get("asyncrl/trainer/tokens_per_s"),
                "weight_version": version,
                "step": last.get(STEP_KEY),
                "lag": 0,
                "last_seen": now,
            }
        }
        rows = list(self._replicas.values())
        if self._metrics:  # the rollout side as a whole: total throughput, weights of the last sync
            rows.append({
                "id": "rollout (all)", "role": "rollout", "state": "running",
                "tokens_per_s": last.get("asyncrl/rollout/tokens_per_s"),
                "weight_version": self._last_sync_version or 0, "last_seen": now,
            })  # fmt: skip
        for row in sorted(rows, key=lambda r: str(r["id"])):
            out = dict(row)
            if out.get("state") in ("running", "idle"):
                out["state"] = state if over else ("paused" if self._paused else out["state"])
            if isinstance(version, int) and isinstance(out.get("weight_version"), int):
                out["lag"] = version - out["weight_version"]
            workers[str(out["id"])] = out
        return workers

    def snapshot(self, since: int = 0, limit: int | None = None) -> dict[str, Any]:
        """The controller's snapshot shape, rebuilt from the files (see `MetricsSource`)."""
        self._refresh()
        metrics = self._metrics[bisect.bisect_right(self._metric_seqs, since) :]
        events = self._events[bisect.bisect_right(self._event_seqs, since) :]
        if limit is not None:
            metrics, events = metrics[-limit:], events[-limit:]
        state = self._state()
        started_at = self._started_at()
        now = self._now(started_at)
        return {
            "cursor": self._seq,
            "truncated": False,
            "now": now,
            "state": state,
            "run": {
                "name": self.config.get("name") or self.run_dir.name,
                "run_dir": str(self.run_dir),
                "started_at": started_at,
                "total_steps": self._total_steps(),
                "address": self.label,
                "config": self.config,
                "provenance": self.provenance,
                "plan": self.prediction,
            },
            "knobs": {n: knob_view(n, st, self._last_request.get(n)) for n, st in self._knobs.items()},
            "workers": self._workers(state, now),
            "metrics": list(metrics),
            "events": list(events),
        }

    def set_knob(self, name: str, value: Any, expected_version: int | None = None) -> dict[str, Any]:
        return {"ok": False, "reason": REPLAY_REASON, "version": None}

    def request_action(self, name: str) -> dict[str, Any]:
        return {"ok": False, "reason": REPLAY_REASON}
