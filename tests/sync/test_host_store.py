"""The weight-sync store listens on its handle's host only (`engine.sync.store`): on a local run, 127.0.0.1."""

from __future__ import annotations

import datetime
import os
import socket

import torch.distributed as dist

from engine.sync.store import host_store


def _listening_ports_by_address() -> dict[int, str]:
    """This process's listening TCP sockets: port → local address (from /proc, as `ss -ltn` reads it)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    out = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in open(table).read().splitlines()[1:]:
            cols = line.split()
            if cols[3] == "0A" and cols[9] in inodes:  # LISTEN
                addr, port = cols[1].split(":")
                out[int(port, 16)] = addr
    return out


def test_the_store_listens_on_loopback_only_and_serves_its_members() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = host_store("127.0.0.1", port, 2, timeout_s=10)
    listening = _listening_ports_by_address()
    assert listening[port] == "0100007F"  # 127.0.0.1 (little-endian hex), not 00000000 / the IPv6 any address
    member = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=10))
    member.set("k", "v")
    assert store.get("k") == b"v"
