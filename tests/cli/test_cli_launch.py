"""`asyncrl launch`: --dry-run prints the resolved config and placement and starts nothing."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

RUNS = Path(__file__).resolve().parents[2] / "presets" / "runs"


def test_dry_run_writes_resolved_config_and_shows_placement(cli, tmp_path: Path) -> None:
    r = cli("launch", RUNS / "qwen3-30b-a3b-base-dapo-megatron-96-32.toml", "--dry-run")
    assert r.exit_code == 0, r.output
    out = r.stdout
    assert "RolloutReplica" in out and "TrainerWorker" in out and "nothing started" in out
    assert "megatron tp2 × pp1 × cp2 × dp8 (ep8)" in out
    run_dir = tmp_path / "runs" / "qwen3-30b-a3b-base-dapo-96-32"
    resolved = json.loads((run_dir / "config.resolved.json").read_text())
    assert resolved["trainer"]["backend"] == "megatron" and resolved["rollout"]["n"] == 16
    prov = json.loads((run_dir / "config.provenance.json").read_text())
    preset = RUNS / "qwen3-30b-a3b-base-dapo-megatron-96-32.toml"
    tp_line = preset.read_text().splitlines().index("tp = 2") + 1
    assert prov["keys"]["trainer.tp"]["where"].endswith(f"{preset.name}:{tp_line}")


def test_dry_run_json_placement(cli) -> None:
    r = cli(
        "launch",
        RUNS / "qwen3-vl-8b-geo3k-fsdp2-npu-2x8.toml",
        "--dry-run",
        "--json",
        "--set",
        "name=vl",
        "--set",
        "logging.run_dir=out/${name}",
    )
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    actors = {a["name"]: a for a in doc["placement"]["actors"]}
    assert actors["RolloutReplica"]["count"] == 16 and actors["RolloutReplica"]["gpus_per_actor"] == 1
    assert actors["TrainerWorker"]["nodes"] == ["trainer-node-0", "trainer-node-1"]
    assert doc["placement"]["nodes"] == {
        "trainer-node-0": 8,
        "trainer-node-1": 8,
        "rollout-node-0": 8,
        "rollout-node-1": 8,
    }
    assert doc["files"]["config"] == "out/vl/config.resolved.json"


def test_invalid_config_starts_nothing(cli) -> None:
    r = cli(
        "launch", RUNS / "qwen3-vl-8b-geo3k-fsdp2-npu-16-16.toml", "--set", "resources.hardware=ascend-910b"
    )
    assert r.exit_code == 3
    assert "gpus_per_node" in r.stderr


def test_launch_calls_the_engine_driver(cli, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict = {}

    def run(cfg, *, provenance, address, resume, tui):
        seen.update(name=cfg.name, provenance=provenance, address=address, resume=resume, tui=tui)
        return 7

    fake = types.ModuleType("engine.runtime.driver")
    fake.run = run  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "engine.runtime.driver", fake)
    r = cli("launch", RUNS / "tiny-cpu.toml", "--address", "auto", "--resume", "auto", "--tui")
    assert r.exit_code == 7
    assert (
        seen["name"] == "tiny-cpu" and seen["address"] == "auto" and seen["resume"] == "auto" and seen["tui"]
    )
    assert "keys" in seen["provenance"]


def test_missing_driver_is_one_clear_message(cli, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "engine.runtime.driver", None)  # import fails
    r = cli("launch", RUNS / "tiny-cpu.toml")
    assert r.exit_code == 1
    assert "engine driver cannot be imported" in r.stderr and "Traceback" not in r.output
