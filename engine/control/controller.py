"""The run's controller as a Ray actor, and how runs are named and found on a cluster.

`RunController` is `ControllerCore` (`engine.control.core`: ring buffers, worker table, versioned knobs)
plus a liveness probe, started once per run as a named actor: `name = run name`, namespace
`asyncrl.<run id>` (`run_namespace`). `live_runs_on_cluster` lists the runs by those names.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from engine.control.core import NAMESPACE, STEP_KEY, TIME_KEY, VERSION_KEY, ControllerCore, default_who

__all__ = [
    "NAMESPACE", "STEP_KEY", "TIME_KEY", "VERSION_KEY", "ControllerCore", "RunController",
    "create_run_controller", "default_who", "live_run_names", "live_runs_on_cluster", "run_namespace",
]  # fmt: skip

# ------------------------------------------------------------------------------------------ actor


class RunController(ControllerCore):
    """The Ray actor body: `ControllerCore` plus a liveness probe. Create it with `create_run_controller`."""

    def ping(self) -> str:
        """Cheap liveness check used by clients; returns the run name."""
        return self.run_name

    def info(self) -> dict[str, Any]:
        """The run's identity: id, name, run dir, start time, address (how a candidate is listed)."""
        return {k: self._run.get(k) for k in ("id", "name", "run_dir", "started_at", "address")}


def run_namespace(run_id: str, prefix: str = NAMESPACE) -> str:
    """The Ray namespace of one run's actors: `<prefix>.<run id>` (`asyncrl.tiny-cpu-3fa9c2`). A namespace per
    run keeps two runs on one cluster apart, even two of the same name; clients find runs by listing the named
    actors under the prefix (the controller is named after the run, the namespace carries the id)."""
    return f"{prefix}.{run_id}"


def create_run_controller(
    run_name: str,
    *,
    run_id: str | None = None,
    namespace: str = NAMESPACE,
    detached: bool = False,
    **core_kwargs: Any,
) -> Any:
    """Start the named `RunController` actor (`name=run_name`, namespace `run_namespace(run_id, namespace)`;
    `run_id` defaults to the name) and return its handle.

    The actor needs no CPU slot (`num_cpus=0`) and lives as long as the driver unless `detached`.
    Raises `ValueError` (from Ray) if a live actor already has that name in the namespace.
    """
    import ray

    if "address" not in core_kwargs:
        core_kwargs["address"] = ray.get_runtime_context().gcs_address
    run_id = run_id or run_name
    options: dict[str, Any] = {"name": run_name, "namespace": run_namespace(run_id, namespace)}
    if detached:
        options["lifetime"] = "detached"
    actor_cls = ray.remote(num_cpus=0, max_restarts=0)(RunController)
    return actor_cls.options(**options).remote(run_name, run_id=run_id, **core_kwargs)


def live_runs_on_cluster(namespace: str = NAMESPACE) -> list[tuple[str, str]]:
    """`(name, id)` of the live runs on the connected cluster: controllers named `X` in a namespace
    `<namespace>.<id>` where the id is `X` or `X-<suffix>`; sorted."""
    import ray

    actors: Iterable[dict[str, str]] = ray.util.list_named_actors(all_namespaces=True)
    prefix = f"{namespace}."
    out = []
    for a in actors:
        name, ns = a.get("name") or "", a.get("namespace") or ""
        run_id = ns[len(prefix):] if ns.startswith(prefix) else ""
        if name and (run_id == name or run_id.startswith(f"{name}-")):
            out.append((name, run_id))
    return sorted(out)


def live_run_names(namespace: str = NAMESPACE) -> list[str]:
    """Names of the live runs on the connected cluster (a name twice when two runs share it)."""
    return [name for name, _ in live_runs_on_cluster(namespace)]
