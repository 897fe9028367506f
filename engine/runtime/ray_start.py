"""Starting or joining the Ray a run uses, safely: the version floor, token auth, loopback-only services, and the
checks made before any work is sent (the cluster's capacity, the object store's size).

Ray runs whatever code a client that reaches its ports submits, so a run only talks to a Ray that refuses
strangers:

- **version**: token auth exists from Ray 2.52 and is on by default for a new local cluster from 2.59; asyncrl
  requires `MIN_RAY` (the version it is tested with) and says so in one line when an older Ray is installed.
- **local run** (no `--address`): `RAY_AUTH_MODE` unset → `token` (Ray generates the token if none exists);
  `RAY_AUTH_MODE=disabled` is refused unless the launch says `--insecure` (then the run's events carry a warning).
  The token file (`RAY_AUTH_TOKEN_PATH`, else `~/.ray/auth_token`) is created 0600 before Ray would create it
  0644, and tightened to 0600 if it exists looser. Every Ray service binds 127.0.0.1: the node's address is the
  loopback one (`_node_ip_address`, and Ray's own switch for a one-machine cluster,
  `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`, under which Ray's gRPC servers listen on the node address only).
- **`--address`**: before `ray.init`, a throw-away process with auth disabled and no token asks the cluster's GCS
  for its keys; the cluster must refuse it (`AuthenticationError`). One that answers is refused with the reason
  (or, with `--insecure`, joined with a warning event); one that cannot be asked (a `ray://` Ray Client address,
  no answer) is refused with what went wrong.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from engine.plan.placement import RAY_ACCELERATOR  # light: no ray at import

MIN_RAY = "2.60.0"
"""The oldest Ray asyncrl runs on (token auth: 2.52; on by default for a local `ray.init()`: 2.59)."""
AUTH_ENV = "RAY_AUTH_MODE"
LOOPBACK = "127.0.0.1"
PROBE_TIMEOUT_S = 30.0


class RunFailed(RuntimeError):
    """A run-time failure with a message meant for the user."""


class StartRefused(RunFailed):
    """The run is not started: Ray is too old, or would run without authentication."""


def check_ray_version(installed: str | None = None) -> None:
    """Refuse a Ray older than `MIN_RAY` (one line: what is installed, what is needed, how to get it)."""
    from importlib.metadata import PackageNotFoundError, version

    from packaging.version import InvalidVersion, Version

    try:
        have = installed or version("ray")
    except PackageNotFoundError:
        raise StartRefused(f"Ray is not installed; asyncrl needs ray>={MIN_RAY} (pip install 'ray>={MIN_RAY}')") \
            from None
    try:
        too_old = Version(have) < Version(MIN_RAY)
    except InvalidVersion:
        too_old = True
    if too_old:
        raise StartRefused(f"Ray {have} is installed; asyncrl needs ray>={MIN_RAY} (token authentication; "
                           f"pip install -U 'ray>={MIN_RAY}')")


def local_auth_mode(insecure: bool) -> str:
    """The auth mode of a new local cluster: "token" (set in the environment when unset, so Ray and its
    processes see it), or "disabled" when the environment says so and the launch said `--insecure`."""
    mode = os.environ.get(AUTH_ENV, "").strip().lower()
    if mode in ("", "token"):
        if os.environ.get(AUTH_ENV) != "token":
            os.environ[AUTH_ENV] = "token"
            _reload_ray_config()
        return "token"
    if mode == "disabled":
        if insecure:
            return "disabled"
        raise StartRefused(f"{AUTH_ENV}=disabled: a local Ray without token authentication runs code for anyone "
                           f"who reaches its ports; unset {AUTH_ENV} (asyncrl uses a token), or pass --insecure")
    raise StartRefused(f"{AUTH_ENV}={os.environ[AUTH_ENV]!r} is not a Ray auth mode (token or disabled)")


def _reload_ray_config() -> None:
    """Ray caches its config (the auth mode among it) per process: re-read it from the environment."""
    if "ray._raylet" not in sys.modules:
        return  # read fresh at import
    from ray._raylet import Config

    Config.initialize("")


def token_path() -> Path:
    """Where Ray reads the token from when `RAY_AUTH_TOKEN` is unset."""
    return Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token").expanduser()


def secure_token_file() -> Path | None:
    """Create the token file 0600 when there is none (Ray would write it 0644), or tighten an existing one to
    0600. None when the token comes from `RAY_AUTH_TOKEN` (no file)."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return None
    path = token_path()
    if not path.exists():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # another launch made it meanwhile
            pass
        else:
            with os.fdopen(fd, "w") as f:
                f.write(_new_token())
    if path.stat().st_mode & 0o077:
        os.chmod(path, 0o600)
    return path


def _new_token() -> str:
    try:
        from ray._private.authentication.authentication_token_generator import (  # private: guarded
            generate_new_authentication_token,
        )

        return generate_new_authentication_token()
    except Exception:  # noqa: BLE001 - any Ray without the helper: the same kind of token
        import secrets

        return secrets.token_hex(32)


_PROBE = """
import os, sys
for k in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
    os.environ.pop(k, None)
os.environ["RAY_AUTH_MODE"] = "disabled"
from ray._raylet import GcsClient
try:
    address = sys.argv[1]
    if address == "auto":  # the cluster `ray start` left this machine's address of
        from ray._private.services import canonicalize_bootstrap_address_or_die
        address = canonicalize_bootstrap_address_or_die(address)
    GcsClient(address=address).internal_kv_keys(b"", None, timeout=10)
except Exception as e:
    print(("refused " if "auth" in (type(e).__name__ + str(e)).lower() else "error ") + str(e).splitlines()[0][:200])
else:
    print("accepted")
"""


def cluster_auth_refusal(address: str) -> str | None:
    """None when the cluster at `address` (host:port of its GCS) refuses a client without a token; else why
    asyncrl will not send it work."""
    if address.startswith("ray://"):
        return (f"cannot check that the Ray Client server at {address} requires a token: give the cluster's GCS "
                "address (host:port, as `ray start --head` prints it), or pass --insecure")
    try:
        out = subprocess.run([sys.executable, "-c", _PROBE, address], capture_output=True, text=True,
                             timeout=PROBE_TIMEOUT_S, env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"})
    except subprocess.TimeoutExpired:
        return f"the cluster at {address} did not answer an authentication check in {PROBE_TIMEOUT_S:g} s"
    verdict = (out.stdout.strip().splitlines() or [f"error the check failed: {out.stderr.strip()[-200:]}"])[-1]
    if verdict.startswith("refused"):
        return None
    if verdict == "accepted":
        return (f"the Ray cluster at {address} accepts clients without a token (anyone who reaches it can run "
                f"code): start it with {AUTH_ENV}=token, or pass --insecure")
    return f"cannot check that the Ray cluster at {address} requires a token: {verdict.removeprefix('error ')}"


RUN_SCOPED_ENV = (AUTH_ENV, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")
"""The process environment a run's Ray start sets (auth mode, loopback switch); restored when the run ends."""


def snapshot_ray_env():
    """Record what `init_ray` may change in this process (`RUN_SCOPED_ENV` and Ray's in-process loopback switch)
    and return a function that puts it back: a run started in-process (tests, notebooks) leaves the process's
    environment — which the Ray processes it starts later inherit — as it found them."""
    before = {k: os.environ.get(k) for k in RUN_SCOPED_ENV}
    mod = sys.modules.get("ray._private.ray_constants")
    cluster_switch = getattr(mod, "ENABLE_RAY_CLUSTER", None)

    def restore() -> None:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        now = sys.modules.get("ray._private.ray_constants")
        if now is not None:  # imported during the run: Ray's own default for the restored environment
            now.ENABLE_RAY_CLUSTER = cluster_switch if cluster_switch is not None else now.env_bool(
                now.ENABLE_RAY_CLUSTERS_ENV_VAR, not now.IS_WINDOWS_OR_OSX)
        # Ray's in-process config is not re-read here: Ray caches the auth mode it first resolved, so a re-read
        # with the variable unset would leave this process's client 'disabled' against the next token cluster

    return restore


def init_ray(address: str | None, placement: dict[str, Any], insecure: bool = False) -> bool:
    """Join `address` or start a local Ray, as the module docstring says. Returns True when this process
    started it. `placement["auth"]` records the mode the run has: "token" or "disabled (--insecure)"."""
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if ray.is_initialized():
        return False
    check_ray_version()
    namespace = placement["namespace"]
    quiet = not os.environ.get("ASYNCRL_DEBUG")
    if address:
        from engine.control.client import cluster_unreachable
        from engine.control.local_ray import use_local_token_for

        why = cluster_unreachable(address)
        if why:
            raise RunFailed(f"no Ray cluster reachable at {address}: {why} (start one with `ray start --head`)")
        use_local_token_for(address)
        refusal = cluster_auth_refusal(address)
        if refusal and not insecure:
            raise StartRefused(refusal)
        placement["auth"] = "disabled (--insecure)" if refusal else "token"
        ray.init(address=address, namespace=namespace, log_to_driver=not quiet, logging_level="ERROR")
        return True
    mode = local_auth_mode(insecure)
    if mode == "token":
        secure_token_file()
    placement["auth"] = "token" if mode == "token" else "disabled (--insecure)"
    from engine.control.local_ray import bind_loopback

    bind_loopback()
    cpus = max(os.cpu_count() or 2, placement["trainer_ranks"] + placement["replicas"])
    # address="local": always a private cluster, never a `ray start` cluster found on this machine
    ray.init(address="local", num_cpus=cpus, include_dashboard=False, namespace=namespace, log_to_driver=not quiet,
             logging_level="ERROR", object_store_memory=placement["object_store_bytes"], _node_ip_address=LOOPBACK)
    if mode == "token":
        secure_token_file()  # whatever Ray did with it
    return True


def object_store_bytes(model_dir: Path) -> int:
    """Object-store size for a local Ray: room for three copies of the weights as fp32 sync buckets (the version
    being pushed, the one kept for replacement replicas, and slack) — so syncs never spill to disk — at least
    1 GiB. `ASYNCRL_OBJECT_STORE_BYTES` overrides it."""
    if os.environ.get("ASYNCRL_OBJECT_STORE_BYTES"):
        return int(os.environ["ASYNCRL_OBJECT_STORE_BYTES"])
    return max(1 << 30, 3 * weight_bytes(model_dir) + (256 << 20))


def weight_bytes(model_dir: Path) -> int:
    """The bytes of the model's `*.safetensors` files."""
    return sum(f.stat().st_size for f in Path(model_dir).glob("*.safetensors"))


def _asked(res: dict[str, Any], name: str) -> float:
    """How many of Ray resource `name` ("GPU", "NPU") one actor's options ask for."""
    return res.get("num_gpus", 0) if name == "GPU" else res.get("resources", {}).get(name, 0)


def check_capacity(placement: dict[str, Any]) -> None:
    """Refuse, in one line, a run whose actors the cluster cannot place: Ray would otherwise wait for the missing
    accelerators forever (as verl's resource-pool check does, before any actor starts)."""
    import ray

    name = RAY_ACCELERATOR.get(placement["device"])
    if name is None:
        return
    per_replica = _asked(placement["replica_res"], name)
    need = placement["replicas"] * per_replica + placement["trainer_ranks"] * _asked(placement["trainer_res"], name)
    have = ray.cluster_resources().get(name, 0)
    if need > have:
        raise RunFailed(f"the Ray cluster has {have:g} {name}(s), this run needs {need:g} ({placement['replicas']} "
                        f"rollout replica(s) × {per_replica:g} + {placement['trainer_ranks']} trainer rank(s)); add "
                        "nodes (`ray status` shows what the cluster has), or lower resources.* / rollout.replicas")
