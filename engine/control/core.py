"""The run's control plane: metric/event ring buffers, worker table, and versioned knobs.

`ControllerCore` is pure Python (no Ray) so it can be unit-tested and embedded in-process. `RunController`
(`engine.control.controller`) is the thin Ray actor around it, created once per run as a named actor
(`name = run name`, namespace `asyncrl.<run id>`). Workers push with fire-and-forget `.remote()` calls; dashboards and `asyncrl ctl` pull with
`snapshot(since=cursor)` and change knobs with compare-and-set.

Cursor. Every metric record and event gets the next integer of one shared sequence. `snapshot(since=c)`
returns the records and events with sequence number > c and the new cursor (the largest number issued), so
a poller that passes back the cursor it got sees every item exactly once, as long as it polls before the
ring buffer evicts it (`truncated` is then True).

Knobs. Each knob has a desired `value` and `version` (incremented on every accepted change) and an
`applied_value` acknowledged by its consumer. `set_knob(..., expected_version=v)` succeeds only if the
knob is still at version `v` (compare-and-set: two operators cannot overwrite each other unknowingly).
The shells read `get_knobs()` and route each change with the knob router (`engine.loop.knobs`: which loop
core takes which knob at which boundary, what is refused); the owning core applies the value and its shell
calls `ack_knob(name, version, step)`; the controller then writes a `knob` event with old → new, who, when,
the step of the request and the step at which it took effect. A resumed run's knobs start from the values in
force at its checkpoint (`resumed_knobs`: `engine.control.knobs.knobs_at_checkpoint`), not from the run file.
"""

from __future__ import annotations

import getpass
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from engine.control.knobs import (
    ACTIONS,
    KNOB_SPECS,
    KnobError,
    KnobRequest,
    KnobSpec,
    KnobState,
    initial_knobs,
    knob_view,
    parse_knob_value,
    validate_knob_value,
)
from engine.telemetry.sinks import Sink, build_sinks

__all__ = [
    "ACTIONS", "KNOB_SPECS", "NAMESPACE", "ControllerCore", "KnobError", "KnobRequest", "KnobSpec",
    "KnobState", "default_who", "initial_knobs", "knob_view", "parse_knob_value", "validate_knob_value",
]  # fmt: skip

NAMESPACE = "asyncrl"
RUN_STATES = ("running", "paused", "finished", "failed")
TERMINAL_STATES = ("finished", "failed")
STEP_KEY = "training/global_step"
VERSION_KEY = "fully_async/count/current_param_version"
TIME_KEY = "asyncrl/time"


def default_who() -> str:
    """`user@host` of the calling process (recorded with every knob change)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


# --------------------------------------------------------------------------------------- ring buffer


class _Ring:
    """A bounded buffer of `(seq, item)` in increasing `seq` order."""

    def __init__(self, capacity: int) -> None:
        self._items: deque[tuple[int, dict[str, Any]]] = deque(maxlen=max(1, capacity))
        self.evicted_upto = 0  # largest seq pushed out of the buffer

    def append(self, seq: int, item: dict[str, Any]) -> None:
        if len(self._items) == self._items.maxlen:
            self.evicted_upto = self._items[0][0]
        self._items.append((seq, item))

    def since(self, cursor: int, limit: int | None = None) -> list[dict[str, Any]]:
        """Items with seq > cursor (the newest `limit` of them when limit is set), oldest first."""
        out: list[dict[str, Any]] = []
        for seq, item in reversed(self._items):
            if seq <= cursor or (limit is not None and len(out) >= limit):
                break
            out.append(item)
        out.reverse()
        return out


# ------------------------------------------------------------------------------------------- core


class ControllerCore:
    """Pure-Python control plane of one run (see the module docstring for the cursor and knob rules)."""

    def __init__(
        self,
        run_name: str,
        run_dir: str | None = None,
        config: dict[str, Any] | None = None,
        provenance: dict[str, Any] | None = None,
        total_steps: int | None = None,
        address: str | None = None,
        sinks: list[Sink] | None = None,
        clock: Callable[[], float] = time.time,
        max_metrics: int = 10_000,
        max_events: int = 10_000,
        run_id: str | None = None,
        prediction: dict[str, Any] | None = None,
        resumed_knobs: dict[str, Any] | None = None,
    ) -> None:
        self._lock = threading.RLock()
        self._clock = clock
        self._config = dict(config or {})
        self._run: dict[str, Any] = {
            "name": run_name,
            "id": run_id or run_name,
            "run_dir": run_dir,
            "started_at": clock(),
            "total_steps": total_steps,
            "address": address,
            "config": self._config,
            "provenance": dict(provenance or {}),
            "plan": dict(prediction) if prediction else None,
        }
        if sinks is None:
            logging_cfg = (
                self._config.get("logging", {}) if isinstance(self._config.get("logging"), dict) else {}
            )
            sinks = build_sinks(
                run_dir,
                list(logging_cfg.get("sinks", ["jsonl"])),
                run_name=run_name,
                project=str(logging_cfg.get("project", "asyncrl")),
                config=self._config,
                aggregate=str(logging_cfg.get("aggregate", "step")),
            )
        self._sinks = sinks
        self._seq = 0
        self._metrics = _Ring(max_metrics)
        self._events = _Ring(max_events)
        self._workers: dict[str, dict[str, Any]] = {}
        self._state = "running"
        self._step: int | None = None
        self._policy_version: int | None = None
        self._knobs = initial_knobs(self._config, resumed_knobs)  # a resume: the values at its checkpoint
        self._last_request: dict[str, KnobRequest] = {}
        self._actions: dict[str, dict[str, KnobRequest]] = {
            consumer: {} for consumer in set(ACTIONS.values())
        }

    # ---------------------------------------------------------------- recording (workers → controller)

    @property
    def run_name(self) -> str:
        return str(self._run["name"])

    def record_metrics(self, record: dict[str, Any]) -> int:
        """Store one metric record (adds `asyncrl/time` if missing), write it to the sinks; return its seq."""
        with self._lock:
            rec = dict(record)
            rec.setdefault(TIME_KEY, self._clock() - self._run["started_at"])
            if isinstance(rec.get(STEP_KEY), (int, float)):
                self._step = int(rec[STEP_KEY])
            if isinstance(rec.get(VERSION_KEY), (int, float)):
                self._policy_version = int(rec[VERSION_KEY])
            self._seq += 1
            self._metrics.append(self._seq, rec)
            for sink in self._sinks:
                sink.write_metrics(rec)
            return self._seq

    def record_event(self, event: dict[str, Any]) -> int:
        """Store one event (defaults for `time`, `step`, `version`, `level`, `message`); return its seq."""
        with self._lock:
            ev = dict(event)
            ev.setdefault("time", self._clock())
            ev.setdefault("kind", "info")
            ev.setdefault("step", self._step)
            ev.setdefault("version", self._policy_version)
            ev.setdefault("message", "")
            ev.setdefault("level", "info")
            self._seq += 1
            self._events.append(self._seq, ev)
            for sink in self._sinks:
                sink.write_event(ev)
            return self._seq

    def _emit(self, kind: str, message: str, level: str = "info", **extra: Any) -> None:
        self.record_event({"kind": kind, "message": message, "level": level, **extra})

    def update_worker(self, worker_id: str, info: dict[str, Any]) -> None:
        """Merge `info` (role, state, tokens_per_s, weight_version, lag, ...) into a row; sets last_seen."""
        with self._lock:
            row = self._workers.setdefault(worker_id, {"id": worker_id})
            row.update(info)
            row["last_seen"] = self._clock()

    def set_state(self, state: str) -> None:
        """Set the run state (running, paused, finished, failed)."""
        if state not in RUN_STATES:
            raise ValueError(f"unknown run state {state!r}; expected one of {', '.join(RUN_STATES)}")
        with self._lock:
            self._state = state

    def update_run_info(self, **fields: Any) -> None:
        """Update run info fields (for example `total_steps`, `address`) after creation."""
        with self._lock:
            self._run.update(fields)

    # ------------------------------------------------------------------------------- knobs (operators)

    def get_knobs(self) -> dict[str, dict[str, Any]]:
        """Every knob: desired value, version, pending flag, applied value/step, last requester, range."""
        with self._lock:
            return {
                name: knob_view(name, st, self._last_request.get(name)) for name, st in self._knobs.items()
            }

    def set_knob(
        self, name: str, value: Any, expected_version: int | None = None, who: str | None = None
    ) -> dict[str, Any]:
        """Request a knob change (compare-and-set when `expected_version` is given).

        Returns `{"ok": bool, "reason": str, "version": int}`; `version` is the knob's version after the call.
        Rejections (unknown knob, wrong type, out of range, stale version, run over) are also logged as
        warning-level `knob` events so the audit trail shows attempted changes.
        """
        who = who or default_who()
        with self._lock:
            st = self._knobs.get(name)
            current_version = st.version if st else 0
            reason = self._reject_reason(name, value, expected_version, st)
            if reason is not None:
                self._emit(
                    "knob",
                    f"rejected {name}={value!r} from {who}: {reason}",
                    level="warning",
                    knob=name,
                    phase="rejected",
                    who=who,
                    requested=_plain(value),
                    reason=reason,
                )
                return {"ok": False, "reason": reason, "version": current_version}
            assert st is not None
            new = validate_knob_value(name, value)
            if new == st.value:
                return {"ok": True, "reason": f"unchanged: {name} is already {new!r}", "version": st.version}
            old = st.value
            st.version += 1
            st.value = new
            req = KnobRequest(value=new, who=who, time=self._clock(), step=self._step)
            st.requests[st.version] = req
            self._last_request[name] = req
            spec = KNOB_SPECS[name]
            self._emit(
                "knob",
                f"{name} {old!r} → {new!r} requested by {who}; applies {spec.applies}",
                knob=name,
                phase="requested",
                old=_plain(old),
                new=_plain(new),
                who=who,
                knob_version=st.version,
                requested_at=req.time,
                requested_step=req.step,
            )
            return {"ok": True, "reason": f"pending: applies {spec.applies}", "version": st.version}

    def _reject_reason(
        self, name: str, value: Any, expected_version: int | None, st: KnobState | None
    ) -> str | None:
        if st is None:
            return f"unknown knob {name!r}; known knobs: {', '.join(KNOB_SPECS)}"
        if self._state in TERMINAL_STATES:
            return f"the run is {self._state}; knobs can no longer change"
        try:
            validate_knob_value(name, value)
        except KnobError as err:
            return str(err)
        if expected_version is not None and expected_version != st.version:
            last = self._last_request.get(name)
            by = f" (set to {st.value!r} by {last.who})" if last else ""
            return (
                f"version conflict: you expected version {expected_version} but {name} is at version "
                f"{st.version}{by}; re-read the knob and retry"
            )
        return None

    def ack_knob(self, name: str, version: int, step: int | None) -> dict[str, Any]:
        """Mark `version` of a knob as applied at `step` and write the `knob` applied event.

        Acknowledging an older version than the latest is allowed (the consumer applied what it saw); the
        knob then stays pending for the newer version.
        """
        with self._lock:
            st = self._knobs.get(name)
            if st is None:
                return {"ok": False, "reason": f"unknown knob {name!r}"}
            req = st.requests.get(version)
            if req is None:
                return {
                    "ok": False,
                    "reason": f"{name} version {version} is not pending (applied: "
                    f"{st.applied_version}, latest: {st.version})",
                }
            old = st.applied_value
            st.applied_value = req.value
            st.applied_version = version
            st.applied_at_step = step
            st.requests = {v: r for v, r in st.requests.items() if v > version}
            if name == "paused" and self._state in ("running", "paused"):
                self._state = "paused" if req.value else "running"
            self._emit(
                "knob",
                f"{name} {old!r} → {req.value!r} applied at step {step} "
                f"(requested by {req.who} at step {req.step})",
                step=step,
                knob=name,
                phase="applied",
                old=_plain(old),
                new=_plain(req.value),
                who=req.who,
                knob_version=version,
                requested_at=req.time,
                requested_step=req.step,
                applied_step=step,
                applied_at=self._clock(),
            )
            return {"ok": True, "reason": "applied"}

    # ----------------------------------------------------------------------------- one-shot actions

    def request_action(self, name: str, who: str | None = None) -> dict[str, Any]:
        """Queue a one-shot action (`checkpoint`, `stop`) for its consumer; repeated requests collapse."""
        who = who or default_who()
        with self._lock:
            consumer = ACTIONS.get(name)
            if consumer is None:
                reason = f"unknown action {name!r}; known actions: {', '.join(ACTIONS)}"
            elif self._state in TERMINAL_STATES:
                reason = f"the run is {self._state}; actions are no longer accepted"
            else:
                reason = None
            if reason is not None:
                self._emit(
                    "knob",
                    f"rejected action {name} from {who}: {reason}",
                    level="warning",
                    action=name,
                    phase="rejected",
                    who=who,
                    reason=reason,
                )
                return {"ok": False, "reason": reason}
            assert consumer is not None
            queued = self._actions[consumer]
            if name in queued:
                return {"ok": True, "reason": f"{name} already requested by {queued[name].who}"}
            queued[name] = KnobRequest(value=True, who=who, time=self._clock(), step=self._step)
            self._emit(
                "knob",
                f"{name} requested by {who}; taken at the {consumer}'s next step boundary",
                action=name,
                phase="requested",
                who=who,
                requested_at=queued[name].time,
                requested_step=self._step,
            )
            return {"ok": True, "reason": f"queued for the {consumer}"}

    def take_actions(self, consumer: str, step: int | None = None) -> list[str]:
        """Return and clear the actions queued for `consumer`, logging when each was taken."""
        with self._lock:
            queued = self._actions.get(consumer, {})
            names = list(queued)
            for name in names:
                req = queued.pop(name)
                self._emit(
                    "knob",
                    f"{name} (requested by {req.who}) taken by the {consumer} at step {step}",
                    step=step if step is not None else self._step,
                    action=name,
                    phase="applied",
                    who=req.who,
                    requested_at=req.time,
                    requested_step=req.step,
                    applied_step=step,
                )
            return names

    # --------------------------------------------------------------------------------------- reading

    def snapshot(self, since: int = 0, limit: int | None = None) -> dict[str, Any]:
        """Everything a dashboard needs, with the metrics and events newer than cursor `since`.

        Returns `{cursor, truncated, now, state, run, knobs, workers, metrics, events}`; `limit` keeps only
        the newest `limit` records/events (for a first attach to a long run).
        """
        with self._lock:
            return {
                "cursor": self._seq,
                "truncated": since < max(self._metrics.evicted_upto, self._events.evicted_upto),
                "now": self._clock(),
                "state": self._state,
                "run": dict(self._run),
                "knobs": self.get_knobs(),
                "workers": {wid: dict(row) for wid, row in self._workers.items()},
                "metrics": self._metrics.since(since, limit),
                "events": self._events.since(since, limit),
            }

    def close(self) -> None:
        """Close the sinks (files are line-buffered, so nothing is lost if this is never called)."""
        with self._lock:
            for sink in self._sinks:
                sink.close()
            self._sinks = []


def _plain(value: Any) -> Any:
    """A JSON-friendly form of a knob value for event fields."""
    return value if isinstance(value, (bool, int, float, str)) or value is None else repr(value)
