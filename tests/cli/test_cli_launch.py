"""`asyncrl launch`: --dry-run prints the resolved config and placement and starts nothing."""

from __future__ import annotations

import json
from pathlib import Path


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


def test_dry_run_prints_the_trainers_precision_policy(cli) -> None:
    """The GPU presets say `model.dtype = "bfloat16"`: bf16 compute over fp32 master weights, as verl's."""
    for preset in ("qwen3-vl-8b-geo3k-fsdp2-npu-16-16.toml", "qwen2.5-math-7b-dapo-fsdp2-64-64.toml",
                   "qwen3-30b-a3b-base-dapo-megatron-96-32.toml"):
        r = cli("launch", RUNS / preset, "--dry-run", "--set", "logging.run_dir=out/${name}")
        assert r.exit_code == 0, r.output
        assert "trainer precision  params fp32 · compute bf16 · grad-reduce fp32 · optimizer fp32" in r.stdout
    doc = json.loads(cli("launch", RUNS / "tiny-cpu.toml", "--dry-run", "--json", "--set",
                         'model.dtype="bfloat16"', "--set", "trainer.fp32_master_weights=false").stdout)
    assert doc["precision"] == {"params": "bfloat16", "compute": "bfloat16", "grad_reduce": "bfloat16",
                                "optimizer": "bfloat16"}
    assert "no-fp32-master-weights" in [p["code"] for p in doc["problems"]]


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


def test_tui_hands_the_driver_the_dashboard_runner(cli, monkeypatch) -> None:
    """The engine does not import the CLI: `launch --tui` passes the dashboard runner in, plain `launch` None."""
    import engine.runtime.driver as driver
    from asyncrl_cli.tui import run_dashboard_with

    calls: list[dict] = []
    monkeypatch.setattr(driver, "run", lambda plan, **kw: calls.append({"plan": plan, **kw}) or 0)
    for extra in (["--tui"], []):
        r = cli("launch", RUNS / "tiny-cpu.toml", *extra)
        assert r.exit_code == 0, r.output
    assert calls[0]["tui"] is run_dashboard_with and calls[1]["tui"] is None
    assert calls[0]["plan"].provenance["keys"]  # the provenance travels with the config, in the plan


def test_the_driver_gets_the_plan_dry_run_shows(cli, monkeypatch) -> None:
    """`launch` hands the driver one typed `RunPlan`: the validated config with M, R and the placement that
    `launch --dry-run --json` prints, computed once."""
    import engine.runtime.driver as driver
    from engine.plan.run_plan import RunPlan

    sets = ("--set", "resources.trainer.gpus_per_node=2", "--set", "resources.rollout.gpus_per_node=3",
            "--set", "rollout.replicas=3")
    dry = json.loads(cli("launch", RUNS / "tiny-cpu.toml", "--dry-run", "--json", *sets).stdout)
    got: list[RunPlan] = []
    monkeypatch.setattr(driver, "run", lambda plan, **kw: got.append(plan) or 0)
    assert cli("launch", RUNS / "tiny-cpu.toml", *sets).exit_code == 0
    plan = got[0]
    assert isinstance(plan, RunPlan) and (plan.trainer_ranks, plan.replicas) == (2, 3)
    assert (plan.actors["trainer_ranks"], plan.actors["replicas"]) == (2, 3)  # what the driver asks Ray for
    assert plan.placement.to_json() == dry["placement"] and plan.derived.to_json() == dry["derived"]
    assert plan.device == "cpu" and plan.config.name == dry["config"]["name"]
