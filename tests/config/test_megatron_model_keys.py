"""`validate` on the Megatron model keys (`engine.config.megatron_model`): uneven stages that do not add up are one
error, the fullest stage is what the memory model counts, MoE losses without a router or a load-balancing type are
said to have no effect, hidden dropout on the torch trainer is refused; the torch trainer's attention modules take
`trainer.attention_dropout`; `launch --dry-run`'s Megatron settings name the attention that runs."""

from __future__ import annotations

from pathlib import Path

from asyncrl_cli.config.loader import analyze_run_config
from asyncrl_cli.config.problems import EXIT_INVALID

RUNS = Path(__file__).resolve().parents[2] / "presets" / "runs"
MOE = RUNS / "qwen3-30b-a3b-base-dapo-megatron-96-32.toml"  # Qwen3-30B-A3B: 48 layers
TINY = RUNS / "tiny-cpu.toml"


def _codes(an) -> dict[str, object]:
    return {p.code: p for p in an.problems}


def test_uneven_stages_that_do_not_add_up_are_one_error_and_the_fullest_stage_is_counted() -> None:
    bad = analyze_run_config(MOE, ["trainer.pp=4", "trainer.num_layers_in_first_pipeline_stage=11"])
    p = _codes(bad)["pp-layers"]
    assert bad.exit_code == EXIT_INVALID and p.key == "trainer.num_layers_in_first_pipeline_stage"
    assert "37 of the model's 48 layers for the 3 middle stage(s)" in p.message and "\n" not in p.message
    even = analyze_run_config(MOE, ["trainer.pp=4"])
    uneven = analyze_run_config(MOE, ["trainer.pp=4", "trainer.num_layers_in_first_pipeline_stage=9",
                                      "trainer.num_layers_in_last_pipeline_stage=9"])  # 9 + 15 + 15 + 9
    assert "pp-layers" not in _codes(even) and "pp-layers" not in _codes(uneven)
    # the 15-layer stages hold more than 48 / 4 layers' weights
    assert uneven.fit.trainer.components_gb["weights"] > even.fit.trainer.components_gb["weights"]
    assert "pp-layers" in _codes(analyze_run_config(MOE, ["trainer.pp=5"]))  # 48 layers do not split 5 ways


def test_moe_losses_without_effect_are_said_and_torch_hidden_dropout_is_refused() -> None:
    an = analyze_run_config(MOE, ["trainer.moe_aux_loss_coeff=0.01"])
    assert "moe-aux-off" in _codes(an) and "load_balancing_type" in _codes(an)["moe-aux-off"].message
    assert "moe-aux-off" not in _codes(analyze_run_config(
        MOE, ["trainer.moe_aux_loss_coeff=0.01", 'trainer.moe_router_load_balancing_type="aux_loss"']))
    torch_run = analyze_run_config(TINY, ["trainer.hidden_dropout=0.1", "trainer.moe_z_loss_coeff=0.001"])
    assert torch_run.exit_code == EXIT_INVALID and _codes(torch_run)["hidden-dropout"].severity == "error"
    assert _codes(torch_run)["megatron-only"].key == "trainer.moe_z_loss_coeff"


def test_the_torch_trainer_s_attention_modules_take_the_dropout() -> None:
    import transformers as tf

    from engine.runtime.backends import with_attention_dropout

    def load() -> object:
        return tf.Qwen2ForCausalLM(tf.Qwen2Config(vocab_size=32, hidden_size=16, intermediate_size=32,
                                                  num_hidden_layers=2, num_attention_heads=2,
                                                  num_key_value_heads=1))

    model = with_attention_dropout(load, 0.25)()
    rates = [m.attention_dropout for m in model.modules() if isinstance(getattr(m, "attention_dropout", None), float)]
    assert len(rates) == 2 and set(rates) == {0.25} and model.config.attention_dropout == 0.25
    assert with_attention_dropout(load, None) is load


def test_the_dry_run_settings_name_the_attention_that_runs() -> None:
    from engine.config.schema import RunConfig
    from engine.plan.megatron_perf import perf_values, resolve_perf

    an = analyze_run_config(MOE, ["trainer.use_flash_attn=true"])
    cfg: RunConfig = an.config
    assert perf_values(cfg, "cuda")["attention"] == "flash" and perf_values(cfg, "cpu")["attention"] == "local"
    (cpu,) = [s for s in resolve_perf(cfg, "cpu") if s.key == "attention"]
    assert "cpu has no flash attention: the local unfused attention runs" in cpu.why
