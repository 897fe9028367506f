"""`asyncrl launch` and Megatron's context parallelism: refused on CPU with the reason (Transformer Engine,
hence CUDA), before anything starts; the CUDA seed presets are not refused (pp and cp run there)."""

from __future__ import annotations

from pathlib import Path

RUNS = Path(__file__).resolve().parents[2] / "presets" / "runs"


def test_cp_on_cpu_is_refused_with_one_line_naming_transformer_engine(cli) -> None:
    r = cli("launch", RUNS / "seed000-mini-cpu.toml", "--set", "trainer.ep=1", "--set", "trainer.cp=2")
    assert r.exit_code == 1
    lines = [ln for ln in r.output.splitlines() if ln.startswith("asyncrl: run failed")]
    assert lines == ["asyncrl: run failed: trainer.cp = 2: context parallelism needs Transformer Engine's attention "
                     "(megatron-core's local attention runs cp = 1 only) and Transformer Engine needs CUDA; on CPU "
                     "set trainer.cp = 1"]
    assert "Traceback" not in r.output


def test_the_seed_presets_cp_and_pp_layouts_are_not_refused() -> None:
    from asyncrl_cli.config.loader import load_run_config
    from engine.runtime.driver import trainer_ranks

    for name in ("qwen3-30b-a3b-base-dapo-megatron-96-32.toml", "qwen3-30b-a3b-base-dapo-megatron-96-32-mis.toml"):
        cfg = load_run_config(RUNS / name).config
        assert cfg.trainer.cp == 2 and trainer_ranks(cfg) == 32
        assert trainer_ranks(load_run_config(RUNS / name, ["trainer.cp=1", "trainer.pp=2"]).config) == 32
