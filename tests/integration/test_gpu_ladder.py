"""The device ladder (`scripts/gpu_ladder.py`) must not rot while no accelerator is lent: its smoke mode builds
every rung's commands and validates (and dry-runs) every launch check's run file, rung 1 runs end to end on the CPU
(`--cpu`: the same checks, a tiny model), and every rung says what it proves and what it does not."""

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
    assert set(rungs) == {"1", "2", "8", "ascend", "bench"}
    assert rungs["1"]["budget_s"] <= 600
    for rung in rungs.values():
        for check in rung["checks"].values():
            assert check["proves"] and check["does_not_prove"]


def test_the_smoke_mode_validates_every_rung_and_dry_runs_its_launches() -> None:
    r = ladder("--smoke", timeout=240)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    doc = json.loads(r.stdout)
    assert doc["ok"] and doc["truncated_moe_config"]
    launches = {name: c for rung in ("8", "ascend") for name, c in doc[rung].items()}
    assert set(launches) == {"seed000_4l_full_driver", "seed000_4l_full_driver_resume", "seed002_one_node",
                             "seed002_one_node_resume"}
    for c in launches.values():
        assert c["validate"]["rc"] == 0 and c["dry_run"]["rc"] == 0
    assert "--resume" in launches["seed000_4l_full_driver_resume"]["command"]
    assert "auto" in launches["seed000_4l_full_driver_resume"]["command"]
    assert "dry run: nothing started" in launches["seed002_one_node"]["dry_run"]["tail"]


def test_the_smoke_mode_fails_a_rung_whose_run_file_does_not_validate(monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import gpu_ladder

    bad = dict(gpu_ladder.RUNGS["8"]["checks"][0], launch=[str(gpu_ladder.RUNG_8.relative_to(ROOT)), "--set",
                                                           "trainer.save_freq=1"])
    monkeypatch.setitem(gpu_ladder.RUNGS, "8", {**gpu_ladder.RUNGS["8"], "checks": [bad]})
    (check,) = gpu_ladder.smoke(["8"])["8"].values()
    assert not check["ok"] and check["validate"]["rc"] == 1 and "save_freq" in check["validate"]["tail"]


def test_rung_8_fits_the_project_memory_check_on_one_node() -> None:
    from asyncrl_cli.config.loader import analyze_run_config

    an = analyze_run_config(ROOT / "scripts" / "ladder" / "rung8-qwen3-30b-a3b-4l.toml")
    assert an.exit_code == 0 and an.fit is not None and an.fit.trainer.fits and an.fit.rollout.fits
    assert an.model.layers == 4 and an.model.hidden == 2048 and an.model.experts == 128
    t = an.config.trainer
    assert (t.tp, t.cp, t.ep) == (2, 2, 4) and not an.config.algorithm.rollout_correction.bypass_mode
    cfg = an.config.resources
    assert cfg.trainer.gpus_per_node + cfg.rollout.gpus_per_node <= an.hardware.gpus_per_node
    ascend = analyze_run_config(ROOT / "scripts" / "ladder" / "rung-ascend-qwen3-vl-8b.toml")
    assert ascend.exit_code == 0 and ascend.hardware.device == "npu"
    res = ascend.config.resources
    assert res.trainer.nnodes == res.rollout.nnodes == 1
    assert res.trainer.gpus_per_node + res.rollout.gpus_per_node <= ascend.hardware.gpus_per_node


def test_a_truncated_checkpoint_keeps_the_first_layers_and_loads(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import torch
    from gpucheck.truncate import truncate_checkpoint
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from engine.models.loader import resolve_model_path

    src = resolve_model_path("builtin:tiny-qwen3-moe", tmp_path / "cache")
    got = truncate_checkpoint(src, tmp_path / "t1", 1, shard_bytes=1 << 16)
    assert got["layers"] == 1 and got["shards"] > 1
    full = AutoModelForCausalLM.from_pretrained(src)
    cut = AutoModelForCausalLM.from_pretrained(tmp_path / "t1")
    assert cut.config.num_hidden_layers == 1 and full.config.num_hidden_layers > 1
    want = {k: v for k, v in full.state_dict().items() if ".layers." not in k or ".layers.0." in k}
    have = cut.state_dict()
    assert set(have) == set(want) and all(torch.equal(have[k], want[k]) for k in want)
    names = {k for f in (tmp_path / "t1").glob("*.safetensors") for k in load_file(f)}
    assert not any(".layers.1." in k for k in names)


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
                                              "weight_sync_vllm", "runtime_placement"}
    assert sections["device_detection"]["blank_visible_devices"].startswith("REFUSED")
    assert sections["fsdp2_world1"]["status"] == "ok" and sections["fsdp2_world1"]["world"] == 1
    assert 0 < sections["precision_update_fraction"]["update_fraction"] <= 1
    assert sections["weight_sync_vllm"]["status"] in ("ok", "skipped")  # skipped where vLLM is not importable
    for s in sections.values():
        assert s["proves"] and s["does_not_prove"]
