"""Clients of the control plane, all serving the same `snapshot(since)` shape (`MetricsSource`).

- `ControlClient`: a live run's `RunController` on a Ray cluster (used by the TUI, `asyncrl ctl`, `status`).
- `ActorSource`: the same over an actor handle the caller already holds (the driver, for `launch --tui`).
- `ReplaySource` (in `engine.runtime.replay_source`, re-exported here): a run directory's `metrics.jsonl` /
  `events.jsonl` / `config.resolved.json`, read-only; it tails the files, so it also follows a live run.
- `LocalSource`: an in-process `ControllerCore` (tests, embedding without Ray).
- `ReadOnlySource`: wraps any source and refuses every mutation (`attach --read-only`).

Errors carry the CLI exit code: 4 for no cluster / run not found / controller unreachable, 2 for an
ambiguous run choice (a usage error).
"""

from __future__ import annotations

import logging
import socket
from typing import Any, Protocol, runtime_checkable

from engine.runtime.control_errors import (
    AmbiguousRunError,
    ControlError,
    NoClusterError,
    RunNotFoundError,
    SourceUnavailable,
)
from engine.runtime.controller import NAMESPACE, ControllerCore, default_who, live_run_names, run_namespace
from engine.runtime.replay_source import ReplaySource

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
    "connect_cluster",
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
    """Finds the `RunController` named `run_name` (namespace `asyncrl.<run_name>`) on a Ray cluster and talks to it.

    With `run_name=None` it picks the only live run, or raises `AmbiguousRunError` listing them.
    Connecting reuses the process's Ray connection when there is one (in-process `launch --tui`, tests).
    After the actor dies, each call looks it up again, so a restarted run with the same name is found.
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
        self.address = address
        self._connect_cluster()
        name = run_name or self._pick_run()
        super().__init__(None, who=who, label="", run_name=name, timeout_s=timeout_s)
        self._handle = self._lookup()
        self.label = self._cluster_address()

    def _connect_cluster(self) -> None:
        connect_cluster(self.address, self.namespace)

    def _cluster_address(self) -> str:
        import ray

        try:
            return str(ray.get_runtime_context().gcs_address)
        except Exception:  # noqa: BLE001 — the address is cosmetic; never fail attaching for it
            return self.address or "auto"

    def list_runs(self) -> list[str]:
        """Names of the live runs (one controller per `asyncrl.<run>` namespace)."""
        return live_run_names(self.namespace)

    def _pick_run(self) -> str:
        runs = self.list_runs()
        if len(runs) == 1:
            return runs[0]
        if not runs:
            hint = "start one with `asyncrl launch`"
            raise RunNotFoundError(f"no live asyncrl run on this cluster ({hint}){self._other_clusters()}")
        raise AmbiguousRunError(f"several runs are live, name one: {', '.join(runs)}")

    def _other_clusters(self) -> str:
        """A hint naming the other Ray clusters on this machine when `auto` picked one of several."""
        if self.address not in (None, "auto"):
            return ""
        here = self._cluster_address()
        others = sorted(a for a in _local_clusters() if a != here)
        if not others:
            return ""
        return f"; other Ray clusters on this machine: {', '.join(others)} (pick one with --address)"

    def _lookup(self) -> Any:
        import ray

        try:
            return ray.get_actor(self.run_name, namespace=run_namespace(self.run_name, self.namespace))
        except ValueError:
            live = self.list_runs()
            hint = f"; live runs: {', '.join(live)}" if live else "; no run is live on this cluster"
            raise RunNotFoundError(f"no run named {self.run_name!r}{hint}{self._other_clusters()}") from None

    def _get_handle(self) -> Any:
        return self._lookup()


def connect_cluster(address: str | None = None, namespace: str = NAMESPACE) -> None:
    """Join the Ray cluster at `address` (default: the one on this machine) unless already connected.

    Raises `NoClusterError` (exit 4) with a one-line reason when none is reachable.
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


def _is_this_machine(address: str) -> bool:
    """True when `address` (host:port, optionally ray://) names an interface of this machine."""
    host = address.removeprefix("ray://").rpartition(":")[0].strip("[]")
    try:
        import ray

        own = {"localhost", "127.0.0.1", "::1", socket.gethostname(), ray.util.get_node_ip_address()}
        return host in own or socket.gethostbyname(host) in own
    except (OSError, ValueError):
        return False


def use_local_token_for(address: str | None) -> None:
    """Before `ray.init(address=...)`: an explicit address of this machine authenticates with the local token."""
    if address not in (None, "auto") and _is_this_machine(address):
        _use_local_token()


def _use_local_token() -> None:
    """Turn on Ray token auth when a local token exists and RAY_AUTH_MODE is unset.

    Ray does this itself for `address="auto"` but never for an explicit address; for an address of this
    very machine the local token is the cluster's, so `--address` behaves like `auto`. Remote clusters
    need `RAY_AUTH_MODE=token` plus the cluster's token (`RAY_AUTH_TOKEN` / `RAY_AUTH_TOKEN_PATH`).
    """
    try:
        from ray._private.authentication.authentication_token_setup import (  # private: guarded
            maybe_enable_token_auth_if_token_available,
        )

        quiet = logging.getLogger("ray._private.authentication.authentication_token_setup")
        level = quiet.level
        quiet.setLevel(logging.ERROR)  # Ray's "token auth is enabled" notice is noise for a client
        try:
            maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
        finally:
            quiet.setLevel(level)
    except Exception:  # noqa: BLE001 — best effort; ray.init reports auth problems itself
        return


def _local_clusters() -> list[str]:
    """GCS addresses of the Ray clusters running on this machine (empty when this cannot be told)."""
    try:
        from ray._private.services import find_gcs_addresses  # private: guarded

        return sorted(find_gcs_addresses())
    except Exception:  # noqa: BLE001 — only used for a hint
        return []


def list_live_runs(address: str | None = None, namespace: str = NAMESPACE) -> list[str]:
    """Connect (see `connect_cluster`) and return the names of the live runs."""
    connect_cluster(address, namespace)
    return live_run_names(namespace)


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
