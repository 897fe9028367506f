"""Joining a Ray cluster of this machine: with its local token, and at its loopback address.

A local run's services listen on 127.0.0.1 only (`engine.runtime.ray_start`), and Ray rewrites a 127.0.0.1
address to the node's network address unless told the node is the loopback one (`bind_loopback`); a `ray start`
cluster that answers on the network address too is left to Ray's rewrite. An explicit address of this machine
authenticates with the local token, as Ray does itself for `address="auto"`.
"""

from __future__ import annotations

import logging
import os
import socket
import sys


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
    """Before `ray.init(address=...)`: an explicit address of this machine authenticates with the local token;
    a loopback one (a local run's: its services listen on 127.0.0.1 only) is joined as the loopback node."""
    if address not in (None, "auto") and _is_this_machine(address):
        host, _, port = address.removeprefix("ray://").rpartition(":")
        if host.strip("[]") in ("127.0.0.1", "localhost", "::1") and not _answers_off_loopback(int(port)):
            bind_loopback()  # else Ray rewrites 127.0.0.1 to this node's network address, where nothing listens
        _use_local_token()


def _answers_off_loopback(port: int) -> bool:
    """Whether this machine's network address answers on `port` too (a `ray start` cluster on every interface:
    Ray's rewrite of 127.0.0.1 to it is right), unlike a local run's, which listens on 127.0.0.1 only."""
    try:
        import ray

        with socket.create_connection((ray.util.get_node_ip_address(), port), timeout=2):
            return True
    except (OSError, ValueError):
        return False


def bind_loopback() -> None:
    """Make this process's (and its children's) Ray take 127.0.0.1 as the node address: a cluster it starts
    listens on the loopback interface only, and a loopback address it joins is not rewritten to the node's
    network address (Ray's switch for a one-machine cluster, `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`)."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # Ray reads it at import: the children
    mod = sys.modules.get("ray._private.ray_constants")
    if mod is not None:  # this process imported Ray already: the same switch, read at call time
        mod.ENABLE_RAY_CLUSTER = False


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
