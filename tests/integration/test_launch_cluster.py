"""`asyncrl launch --address` joins a cluster started with `ray start --head` (and leaves it running), and a
launch that fails at run time exits non-zero with one line, never a traceback."""

from __future__ import annotations

import os
import re
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
                          timeout=600, env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"})


def test_launch_joins_a_running_cluster(tmp_path):
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    start = subprocess.run([str(BIN / "ray"), "start", "--head", f"--port={_free_port()}", "--num-cpus=2",
                            "--include-dashboard=false", "--disable-usage-stats"],
                           capture_output=True, text=True, env=env, timeout=180)
    assert start.returncode == 0, start.stderr
    try:
        address = re.search(r"ray start --address='([^']+)'", start.stdout).group(1)
        done = _launch(tmp_path / "run", "--address", address)
        assert done.returncode == 0, done.stderr
        assert len(train_records(tmp_path / "run")) == 4
        assert "Traceback" not in done.stderr
        # the cluster outlives the run: a second launch joins it again
        again = _launch(tmp_path / "run2", "--address", address)
        assert again.returncode == 0, again.stderr
    finally:
        subprocess.run([str(BIN / "ray"), "stop", "--force"], capture_output=True, timeout=120, env=env)


def test_unreachable_address_is_one_clear_line(tmp_path):
    done = _launch(tmp_path / "run", "--address", f"127.0.0.1:{_free_port()}")
    assert done.returncode != 0
    assert "Traceback" not in done.stderr and "Traceback" not in done.stdout
    assert done.stderr.strip(), "a message must say why"
