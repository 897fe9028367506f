"""`asyncrl launch` and Megatron's context parallelism: refused on CPU with the reason (Transformer Engine,
hence CUDA), before anything starts; the CUDA seed presets are not refused (pp and cp run there)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

RUNS = Path(__file__).resolve().parents[2] / "presets" / "runs"


def test_cp_on_cpu_is_refused_by_validate_naming_transformer_engine(cli) -> None:
    sets = ("--set", "trainer.ep=1", "--set", "trainer.cp=2")
    r = cli("validate", RUNS / "seed000-mini-cpu.toml", *sets, "--json")
    assert r.exit_code == 1, r.output
    problems = [p for p in json.loads(r.output)["problems"] if p["severity"] == "error"]
    assert [(p["code"], p["key"]) for p in problems] == [("megatron-cp-cpu", "trainer.cp")]
    assert "Transformer Engine needs CUDA" in problems[0]["message"]
    r = cli("launch", RUNS / "seed000-mini-cpu.toml", *sets)
    assert r.exit_code == 1 and "Transformer Engine needs CUDA" in r.output and "Traceback" not in r.output


def test_the_driver_refuses_cp_on_cpu_in_one_line() -> None:
    """The engine's own guard, for a plan that did not come through validate."""
    from asyncrl_cli.config.loader import load_run_config
    from engine.plan.run_plan import resolve_plan
    from engine.runtime.driver import RunFailed, trainer_ranks

    cfg = load_run_config(RUNS / "seed000-mini-cpu.toml", ["trainer.ep=1"]).config
    cfg = cfg.model_copy(update={"trainer": cfg.trainer.model_copy(update={"cp": 2})})  # past validate's refusal
    with pytest.raises(RunFailed, match="Transformer Engine needs CUDA; on CPU set trainer.cp = 1"):
        trainer_ranks(resolve_plan(cfg))


def test_the_seed_presets_cp_and_pp_layouts_are_not_refused() -> None:
    from asyncrl_cli.config.loader import load_run_config
    from engine.plan.run_plan import resolve_plan
    from engine.runtime.driver import trainer_ranks

    for name in ("qwen3-30b-a3b-base-dapo-megatron-96-32.toml", "qwen3-30b-a3b-base-dapo-megatron-96-32-mis.toml",
                 "qwen3-30b-a3b-base-dapo-megatron-96-32-is.toml"):
        cfg = load_run_config(RUNS / name).config
        assert cfg.trainer.cp == 2 and trainer_ranks(resolve_plan(cfg)) == 32
        assert trainer_ranks(resolve_plan(load_run_config(RUNS / name, ["trainer.cp=1", "trainer.pp=2",
                                                                          "trainer.use_dynamic_bsz=false"]).config)) == 32
