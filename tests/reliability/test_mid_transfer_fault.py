"""`debug.kill_replica_mid_sync_file` (`engine.runtime.replica.killed_mid_transfer`) in a process of its own: with
the file present, the consumer gets the first bucket and the process is SIGKILLed once the second has arrived,
the file deleted (one death per file); without it every bucket passes and the source is closed. The whole
fault in a real run (a replacement whose weights pass the delivery check): `test_replica_failure.py`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = """
import sys
from engine.runtime.replica import killed_mid_transfer

def source():
    try:
        for k in range(3):
            yield k
    finally:
        print("source closed", flush=True)

for b in killed_mid_transfer(source(), sys.argv[1]):
    print("loaded", b, flush=True)
"""


def _consume(trigger: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", SCRIPT, str(trigger)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


def test_the_receiver_dies_between_the_first_and_the_second_bucket_only_while_the_file_exists(tmp_path) -> None:
    trigger = tmp_path / "kill-receiver"
    out = _consume(trigger)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:-1] == ["loaded 0", "loaded 1", "loaded 2", "source closed"]
    trigger.touch()
    out = _consume(trigger)
    assert out.returncode == -signal.SIGKILL, (out.returncode, out.stderr[-2000:])
    assert out.stdout.split("\n")[:-1] == ["loaded 0"]  # bucket 1 arrived, was never loaded
    assert not trigger.exists()  # claimed: the next sync goes through (the first case)
