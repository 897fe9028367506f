"""`asyncrl launch --address` joins a cluster started with `ray start --head` (and leaves it running), and a
launch that fails at run time exits non-zero with one line, never a traceback."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from run_helpers import REPO, TINY, train_records

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent
SMALL = ["--set", "trainer.ppo_mini_batch_size=8", "--set", "rollout.n=4", "--set", "rollout.total_rollout_steps=32",
         "--set", "trainer.test_freq=0", "--set", "logging.progress=false"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _launch(run_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "asyncrl"), "launch", str(TINY), *SMALL, "--set",
                           f'logging.run_dir="{run_dir}"', *extra], capture_output=True, text=True, cwd=REPO,
                          timeout=600, env={**{k: v for k, v in os.environ.items()
                                               if k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"},
                                            "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token"})


def _head_address(head: subprocess.Popen, seen: list[str], timeout_s: float = 120.0) -> str | None:
    """The address `ray start` prints, read with a deadline (a head that never prints it must not hang the test);
    the lines read go to `seen` (the failure message shows them). A thread reads the lines: a `select` on the pipe
    misses lines already pulled into the reader's buffer (the address line then waits there until the deadline)."""
    import queue
    import threading
    import time

    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in head.stdout], daemon=True).start()
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        try:
            line = lines.get(timeout=min(left, 1.0))
        except queue.Empty:
            if head.poll() is not None and lines.empty():
                return None
            continue
        seen.append(line.rstrip())
        m = re.search(r"ray start --address='([^']+)'", line)
        if m:
            return m.group(1)
    return None


def test_launch_joins_a_running_cluster(tmp_path):
    # a cluster as an operator starts it: token auth on (asyncrl refuses to send work to one that lets anyone in),
    # nothing of this test process's own Ray settings (an in-process run sets them for itself)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"}
    env.update({"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token"})
    # `--block` keeps `ray start` in the foreground: ending its session stops exactly this cluster
    # (`ray stop` would stop every Ray on the machine)
    head = subprocess.Popen([str(BIN / "ray"), "start", "--head", "--block", f"--port={_free_port()}", "--num-cpus=2",
                             "--include-dashboard=false", "--disable-usage-stats"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
    try:
        seen: list[str] = []
        address = _head_address(head, seen)
        assert address, "ray start printed no address; it printed:\n" + "\n".join(seen[-30:])
        done = _launch(tmp_path / "run", "--address", address)
        assert done.returncode == 0, done.stderr
        assert len(train_records(tmp_path / "run")) == 4
        assert "Traceback" not in done.stderr
        # the cluster outlives the run: a second launch joins it again
        again = _launch(tmp_path / "run2", "--address", address)
        assert again.returncode == 0, again.stderr
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        head.wait(timeout=120)


def test_unreachable_address_is_one_clear_line(tmp_path):
    done = _launch(tmp_path / "run", "--address", f"127.0.0.1:{_free_port()}")
    assert done.returncode != 0
    assert "Traceback" not in done.stderr and "Traceback" not in done.stdout
    assert done.stderr.strip(), "a message must say why"
