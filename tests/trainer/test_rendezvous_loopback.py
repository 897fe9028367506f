"""Trainer ranks' process-group rendezvous (`engine.trainer.process_groups.init_process_group`): rank 0 hosts the
store on the rendezvous address only (127.0.0.1 here), and the ranks still form a working group."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
WORKER = """
import json, os, sys
import torch, torch.distributed as dist
from engine.trainer.process_groups import init_process_group
rank, port = int(sys.argv[1]), int(sys.argv[2])
init_process_group(rank, 2, f"tcp://127.0.0.1:{port}", "cpu", backend="gloo", timeout_s=60)
t = torch.tensor([rank + 1.0])
dist.all_reduce(t)
listen = []
if rank == 0:  # this process's listening sockets on the store's port, as `ss -ltn` reads them (/proc/net/tcp*)
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in open(table).read().splitlines()[1:]:
            cols = line.split()
            if cols[3] == "0A" and int(cols[1].split(":")[1], 16) == port:
                listen.append(cols[1].split(":")[0])
print(json.dumps({"sum": t.item(), "listen": listen}))
dist.destroy_process_group()
"""


def test_rank_0_hosts_the_rendezvous_on_loopback_only_and_the_group_works() -> None:
    import json

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(r), str(port)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    docs = [json.loads(o[0].strip().splitlines()[-1]) for o in outs]
    assert [d["sum"] for d in docs] == [3.0, 3.0]  # 1 + 2 on both ranks
    assert docs[0]["listen"] == ["0100007F"]  # 127.0.0.1 only; torch's own store would listen on 00000000 / ::
