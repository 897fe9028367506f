"""The device ladder (`scripts/gpu_ladder.py`) must not rot while no accelerator is lent: rung 1 runs end to end on
the CPU (`--cpu`: the same checks, a tiny model), and every rung says what it proves and what it does not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'scripts'}", "HF_HUB_OFFLINE": "1"}


def ladder(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "scripts/gpu_ladder.py", *args], cwd=ROOT, env=ENV, capture_output=True,
                          text=True, timeout=timeout)


def test_every_rung_is_listed_with_what_it_proves_and_does_not() -> None:
    r = ladder("--list", timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    rungs = json.loads(r.stdout)
    assert set(rungs) == {"1", "2", "8", "ascend"}
    assert rungs["1"]["budget_s"] <= 600
    for rung in rungs.values():
        for check in rung["checks"].values():
            assert check["proves"] and check["does_not_prove"]


def test_a_rung_without_its_devices_says_so_and_writes_its_report(tmp_path: Path) -> None:
    r = ladder("--rung", "2", "--out", str(tmp_path / "r2.json"), timeout=120)
    report = json.loads((tmp_path / "r2.json").read_text())
    assert r.returncode == 2 and "needs 2 cuda devices" in report["skipped"]


@pytest.mark.slow
def test_rung_1_runs_end_to_end_on_the_cpu(tmp_path: Path) -> None:
    out = tmp_path / "r1.json"
    r = ladder("--rung", "1", "--cpu", "--out", str(out))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    report = json.loads(out.read_text())
    sections = report["sections"]
    assert report["ok"] and set(sections) == {"device_detection", "fsdp2_world1", "precision_update_fraction",
                                              "weight_sync_vllm"}
    assert sections["device_detection"]["blank_visible_devices"].startswith("REFUSED")
    assert sections["fsdp2_world1"]["status"] == "ok" and sections["fsdp2_world1"]["world"] == 1
    assert 0 < sections["precision_update_fraction"]["update_fraction"] <= 1
    assert sections["weight_sync_vllm"]["status"] in ("ok", "skipped")  # skipped where vLLM is not importable
    for s in sections.values():
        assert s["proves"] and s["does_not_prove"]
