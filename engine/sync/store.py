"""The `TCPStore` a weight-sync sender hosts (the rendezvous of `engine.sync.collective` and
`engine.sync.shared_memory`), listening on the handle's host address only.

torch's store server listens on every interface; a sync needs only the address its handle carries. That is
127.0.0.1 for a local run (`engine.runtime.ray_start` makes it the node address), so nothing off the machine
can reach the store; on a cluster it is the node's own address. The listening socket is bound here and handed
to torch (`master_listen_fd`), which owns it from then on (it closes it with the store).
"""

from __future__ import annotations

import datetime as _dt
import socket

import torch.distributed as dist


def host_store(host: str, port: int, world: int, timeout_s: float) -> dist.TCPStore:
    """The master store of `world` members at `host:port`, listening on `host` alone."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(1024)
    except OSError:
        sock.close()
        raise
    return dist.TCPStore(host, port, world, is_master=True, timeout=_dt.timedelta(seconds=timeout_s),
                         wait_for_workers=False, master_listen_fd=sock.detach())
