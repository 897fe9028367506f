"""`scripts/gpu_runtime_check.py` (run on a lent GPU) must not rot: its CPU mode walks the same path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.integration
def test_runtime_device_check_passes_on_the_cpu_preset() -> None:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'scripts'}", "HF_HUB_OFFLINE": "1"}
    r = subprocess.run([sys.executable, "scripts/gpu_runtime_check.py", "cpu"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads(r.stdout.strip().splitlines()[-1])
    assert report["ok"] and report["trainer_device"] == "cpu" and report["replica_weights_equal_trainer"]
