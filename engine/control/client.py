"""Clients of the control plane, all serving the same `snapshot(since)` shape (`MetricsSource`).

- `ControlClient`: a live run's `RunController` on a Ray cluster (used by the TUI, `asyncrl ctl`, `status`),
  found by `find_run` (below).
- `ActorSource`: the same over an actor handle the caller already holds (the driver, for `launch --tui`).
- `ReplaySource` (`engine.control.replay`; `open_source` returns one for a run directory): a run directory's
  `metrics.jsonl` / `events.jsonl` / `config.resolved.json`, read-only; it tails the files, so it also follows a
  live run.
- `LocalSource`: an in-process `ControllerCore` (tests, embedding without Ray).
- `ReadOnlySource`: wraps any source and refuses every mutation (`attach --read-only`).

Finding a run (`find_run`). What the user typed — a run id, a name, or a unique id prefix — is resolved
without a process-wide Ray connection through the registry of live runs on this machine (`engine.control.registry`),
and the client joins *that run's own* Ray cluster by the address the run recorded; `ray_current_cluster`
and `address="auto"` are never consulted, so several local runs (each with its private Ray) and a stale file
left by an old `ray start` cannot redirect a command. With `--address` (or a connection this process already
holds) the run is looked up among the cluster's run namespaces (`asyncrl.<run id>`) instead. A name that
matches several live runs is refused with the candidates (id, dir, start time).

Errors are typed (`engine.control.errors`): no cluster, run not found, controller unreachable, an ambiguous
run choice, a refused change; the CLI maps each type to its exit code.
"""

from __future__ import annotations

import logging
import socket
import sys
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from engine.control.errors import (
    AmbiguousRunError,
    ControlError,
    NoClusterError,
    RunNotFoundError,
    SourceUnavailable,
)
from engine.control.local_ray import use_local_token_for
from engine.control.controller import NAMESPACE, live_run_names, run_namespace
from engine.control.core import ControllerCore, default_who
from engine.control.replay import ReplaySource
from engine.control.registry import RunEntry, ambiguity_message, live_runs, match, resolve

__all__ = [
    "ActorSource",
    "AmbiguousRunError",
    "ControlClient",
    "ControlError",
    "LocalSource",
    "MetricsSource",
    "NoClusterError",
    "ReadOnlySource",
    "ReplaySource",
    "RunNotFoundError",
    "SourceUnavailable",
    "RunTarget",
    "connect_cluster",
    "find_run",
    "list_live_runs",
    "open_source",
]

READ_ONLY_REASON = "read-only attach: changes are disabled"


@runtime_checkable
class MetricsSource(Protocol):
    """What the dashboard and the CLI read from: a live controller or a recorded run."""

    read_only: bool
    label: str

    def snapshot(self, since: int = 0, limit: int | None = None) -> dict[str, Any]:
        """`{cursor, truncated, now, state, run, knobs, workers, metrics, events}` (items after `since`)."""
        ...

    def set_knob(self, name: str, value: Any, expected_version: int | None = None) -> dict[str, Any]:
        """Compare-and-set a knob; `{"ok", "reason", "version"}`."""
        ...

    def request_action(self, name: str) -> dict[str, Any]:
        """Queue a one-shot action (`checkpoint`, `stop`); `{"ok", "reason"}`."""
        ...


class ActorSource:
    """A `MetricsSource` over a `RunController` actor handle (the driver's own, for `launch --tui`).

    Every call waits at most `timeout_s`; a dead actor or an unreachable cluster raises `SourceUnavailable`.
    """

    read_only = False

    def __init__(
        self,
        handle: Any,
        *,
        who: str | None = None,
        label: str = "local",
        run_name: str = "",
        timeout_s: float = 10.0,
    ) -> None:
        self._handle = handle
        self.who = who or default_who()
        self.label = label
        self.run_name = run_name
        self.timeout_s = timeout_s

    def _get_handle(self) -> Any:
        raise SourceUnavailable(f"lost the controller of {self.run_name or 'the run'}")

    def _call(self, method: str, *args: Any) -> Any:
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError, RaySystemError

        try:
            if self._handle is None:
                self._handle = self._get_handle()
            return ray.get(getattr(self._handle, method).remote(*args), timeout=self.timeout_s)
        except RunNotFoundError as err:
            raise SourceUnavailable(f"run {self.run_name!r} is gone ({err})") from None
        except GetTimeoutError:
            raise SourceUnavailable(
                f"controller of {self.run_name!r} did not answer within {self.timeout_s:g} s"
            ) from None
        except (RayActorError, RaySystemError, ConnectionError) as err:
            self._handle = None
            raise SourceUnavailable(f"lost the controller of {self.run_name!r}: {_first_line(err)}") from None

    def snapshot(self, since: int = 0, limit: int | None = None) -> dict[str, Any]:
        return dict(self._call("snapshot", since, limit))

    def get_knobs(self) -> dict[str, dict[str, Any]]:
        return dict(self._call("get_knobs"))

    def set_knob(self, name: str, value: Any, expected_version: int | None = None) -> dict[str, Any]:
        return dict(self._call("set_knob", name, value, expected_version, self.who))

    def request_action(self, name: str) -> dict[str, Any]:
        return dict(self._call("request_action", name, self.who))


class ControlClient(ActorSource):
    """Talks to the `RunController` of the run `run` names (an id, a name or an id prefix; see `find_run`).

    With `run=None` it picks the only live run, or raises `AmbiguousRunError` listing them. The controller is
    the actor named after the run in namespace `asyncrl.<run id>`; after it dies, each call looks that same
    run up again (never another run of the same name).
    """

    def __init__(
        self,
        run_name: str | None = None,
        address: str | None = None,
        *,
        namespace: str = NAMESPACE,
        who: str | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        self.namespace = namespace
        target = find_run(run_name, address, namespace)
        self.address = target.address
        self.run_id = target.run_id
        super().__init__(None, who=who, label="", run_name=target.name, timeout_s=timeout_s)
        self._handle = self._lookup()
        self.label = self._cluster_address()

    def _cluster_address(self) -> str:
        import ray

        try:
            return str(ray.get_runtime_context().gcs_address)
        except Exception:  # noqa: BLE001 — the address is cosmetic; never fail attaching for it
            return self.address or "?"

    def list_runs(self) -> list[str]:
        """Names of the live runs on the connected cluster (a controller per `asyncrl.<run id>` namespace)."""
        return live_run_names(self.namespace)

    def _lookup(self) -> Any:
        import ray

        try:
            return ray.get_actor(self.run_name, namespace=run_namespace(self.run_id, self.namespace))
        except ValueError:
            raise RunNotFoundError(
                f"no run named {self.run_name!r} with id {self.run_id} on the cluster at "
                f"{self._cluster_address()}: it has ended"
            ) from None

    def _get_handle(self) -> Any:
        return self._lookup()


@dataclass
class RunTarget:
    """The run a command acts on: its name, id, the Ray address to join (None: this process's connection)."""

    name: str
    run_id: str
    address: str | None
    run_dir: str | None = None


def ray_connected() -> bool:
    """True when this process already holds a Ray connection (checked without importing ray)."""
    ray = sys.modules.get("ray")
    return bool(ray is not None and ray.is_initialized())


def find_run(run: str | None, address: str | None = None, namespace: str = NAMESPACE) -> RunTarget:
    """Resolve `run` (id, name or id prefix; None = the only live run) to one run and connect this process to
    that run's cluster (see the module docstring).

    Without `address` and without a Ray connection in this process: through the registry of live runs on this
    machine, then to the address that run recorded. Otherwise: among the runs on the cluster at `address` (or
    the connected one). Raises `RunNotFoundError`, `AmbiguousRunError`, `NoClusterError`.
    """
    if address is None and not ray_connected():
        try:
            entry = resolve(run, live_runs())
        except RunNotFoundError as err:
            hint = "for a run on another machine's cluster pass --address HOST:PORT"
            raise RunNotFoundError(f"{err} ({hint})") from None
        if not entry.address:
            raise RunNotFoundError(f"run {entry.id} is still starting (its Ray cluster is not up yet); "
                                   "try again in a few seconds")
        connect_cluster(entry.address, namespace)
        return RunTarget(entry.name, entry.id, entry.address, entry.run_dir)
    connect_cluster(address, namespace)
    where = f"on the cluster at {address}" if address else "on the connected cluster"
    entries = cluster_runs(namespace, describe=False)
    found = entries if run is None else match(run, entries)
    if len(found) > 1:
        _describe(found, namespace)
        raise AmbiguousRunError(ambiguity_message(run, found, where))
    entry = resolve(run, found or entries, where)
    return RunTarget(entry.name, entry.id, address, entry.run_dir)


def cluster_runs(namespace: str = NAMESPACE, describe: bool = True) -> list[RunEntry]:
    """The runs on the connected cluster as registry-style entries (dir, start time, address asked from each
    controller when `describe`)."""
    from engine.control.controller import live_runs_on_cluster

    entries = [RunEntry(id=rid, name=name, pid=0, host="", started=0.0) for name, rid in
               live_runs_on_cluster(namespace)]
    if describe:
        _describe(entries, namespace)
    return entries


def _describe(entries: list[RunEntry], namespace: str, timeout_s: float = 5.0) -> None:
    """Fill in each entry's run dir, start time and address from its controller (best effort)."""
    import ray

    for e in entries:
        try:
            info = ray.get(ray.get_actor(e.name, namespace=run_namespace(e.id, namespace)).info.remote(),
                           timeout=timeout_s)
        except Exception:  # noqa: BLE001 — a listing never fails for one silent controller
            continue
        e.run_dir, e.address = info.get("run_dir"), info.get("address")
        e.started = float(info.get("started_at") or 0)


def connect_cluster(address: str | None = None, namespace: str = NAMESPACE) -> None:
    """Join the Ray cluster at `address` unless already connected (`None`/"auto": Ray's own discovery on this
    machine — only `launch --address auto` and an explicit `--address auto` use it; `find_run` never does).

    Raises `NoClusterError` with a one-line reason when none is reachable.
    """
    import ray

    if ray.is_initialized():
        return
    where = address or "auto (this machine)"
    hint = "is a run started (asyncrl launch)? pass --address HOST:PORT for a remote cluster"
    problem = cluster_unreachable(address)
    if problem is not None:
        raise NoClusterError(f"no Ray cluster reachable at {where}: {problem} — {hint}")
    use_local_token_for(address)
    try:
        ray.init(
            address=address or "auto",
            namespace=namespace,
            ignore_reinit_error=True,
            logging_level=logging.ERROR,
            log_to_driver=False,
        )
    except (ConnectionError, RuntimeError, ValueError) as err:
        raise NoClusterError(f"no Ray cluster reachable at {where}: {_first_line(err)} — {hint}") from None


def cluster_unreachable(address: str | None, timeout_s: float = 3.0) -> str | None:
    """Why the cluster's GCS cannot be reached by TCP (None when it can, or when this cannot be told).

    `ray.init` retries an unreachable address for minutes; this check fails in `timeout_s` instead.
    """
    target = address
    if target is None or target == "auto":
        try:
            from ray._private.services import canonicalize_bootstrap_address  # private: guarded
        except ImportError:
            return None
        try:
            target = canonicalize_bootstrap_address("auto")
        except ConnectionError as err:
            return _first_line(err)
        except Exception:  # noqa: BLE001 — unknown private-API behaviour: let ray.init decide
            return None
        if target is None:
            return "no running Ray cluster found"
    if target.startswith("ray://"):
        target = target[len("ray://") :]
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        return None
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return None
    except OSError as err:
        return f"cannot connect to {host}:{port} ({err.strerror or err})"


def list_live_runs(address: str | None = None, namespace: str = NAMESPACE) -> list[dict[str, Any]]:
    """The live runs `asyncrl status` lists: those of this machine's registry (no Ray connection needed), or,
    with `address` or a connection already held, those on that cluster. Each: id, name, run_dir, address, pid,
    started (pid is None for a cluster listing)."""
    if address is None and not ray_connected():
        return [e.to_json() for e in live_runs()]
    connect_cluster(address, namespace)
    return [{**e.to_json(), "pid": None, "host": None} for e in cluster_runs(namespace)]


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


class LocalSource:
    """A `MetricsSource` over an in-process `ControllerCore` (no Ray)."""

    read_only = False

    def __init__(self, core: ControllerCore, who: str | None = None, label: str = "in-process") -> None:
        self.core = core
        self.who = who or default_who()
        self.label = label

    def snapshot(self, since: int = 0, limit: int | None = None) -> dict[str, Any]:
        return self.core.snapshot(since, limit)

    def set_knob(self, name: str, value: Any, expected_version: int | None = None) -> dict[str, Any]:
        return self.core.set_knob(name, value, expected_version, who=self.who)

    def request_action(self, name: str) -> dict[str, Any]:
        return self.core.request_action(name, who=self.who)


class ReadOnlySource:
    """Wraps a source for `--read-only`: reads pass through, every mutation is refused."""

    read_only = True

    def __init__(self, inner: MetricsSource) -> None:
        self.inner = inner
        self.label = inner.label

    def snapshot(self, since: int = 0, limit: int | None = None) -> dict[str, Any]:
        return self.inner.snapshot(since, limit)

    def set_knob(self, name: str, value: Any, expected_version: int | None = None) -> dict[str, Any]:
        return {"ok": False, "reason": READ_ONLY_REASON, "version": None}

    def request_action(self, name: str) -> dict[str, Any]:
        return {"ok": False, "reason": READ_ONLY_REASON}


def open_source(
    run: str | None = None, address: str | None = None, replay: str | None = None, read_only: bool = False
) -> MetricsSource:
    """The source `attach`/`status` use: a replay of `replay` (always read-only) or the live run."""
    if replay is not None:
        return ReplaySource(replay)
    client = ControlClient(run, address)
    return ReadOnlySource(client) if read_only else client
