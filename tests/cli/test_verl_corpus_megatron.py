"""The corpus's Megatron scripts with what verl does beyond the keys' names: uneven pipeline stages, the MoE
router's auxiliary losses, the attention kernel, dropout, the reference's own layout, and a sequence policy loss in
bypass mode (verl 1dda039's workers run it against π_rollout without rollout correction: asyncrl runs the same, or
refuses the one combination it would run differently). Given data, the two scripts these keys used to stop
validate."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from asyncrl_cli.verl_import.convert import convert_script

CORPUS = Path(__file__).parent / "verl_corpus"
GEO = "geo3k_qwen3vl_30b_megatron_6_2_npu_async"
BIG = "grpo_qwen3_235b_megatron_npu"
TC = "actor_rollout_ref.actor.megatron.override_transformer_config"
RC = "algorithm.rollout_correction"


def _text(name: str) -> str:
    return (CORPUS / f"{name}.sh").read_text()


def _rows(path: Path, images: bool, n: int = 160) -> None:
    """n rows in verl's layout (more than one policy version of the 235B script, 128 prompts)."""
    messages = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
    question = [{"role": "user", "content": ("<image>" if images else "") + "What is 2 + 3?"}]
    cols = {"prompt": pa.array([question] * n, messages),
            "data_source": pa.array(["openai/gsm8k"] * n),
            "reward_model": pa.array([{"style": "rule", "ground_truth": "5"}] * n)}
    if images:
        cols["images"] = pa.array([[{"bytes": b"\x89PNG", "path": None}]] * n)
    pq.write_table(pa.table(cols), path)


def test_the_megatron_scripts_validate_with_their_data(cli, tmp_path: Path) -> None:
    """With train / validation files where the scripts point, the geo3k script converts into a valid file (exit 0)
    and the 235B one into a file whose only problem is the fit of its trainer on a 64 GB Ascend 910C (exit 3)."""
    for name, images, old in ((GEO, True, "/data/geo3k/"), (BIG, False, "gsm8k/")):
        for split in ("train", "test"):
            _rows(tmp_path / f"{split}.parquet", images)
        (tmp_path / f"{name}.sh").write_text(_text(name).replace(old, f"{tmp_path}/"))
        r = cli("import", "verl", tmp_path / f"{name}.sh", "-o", f"{name}.toml", "--force")
        written = tomllib.loads((tmp_path / f"{name}.toml").read_text())
        if name == GEO:
            assert r.exit_code == 0, r.output
            assert written["trainer"]["moe_z_loss_coeff"] == 0.001 and written["trainer"]["pp"] == 2
        else:
            assert r.exit_code == 3, r.output
            assert "but 'ascend-910c' has 64 GB" in r.output and "no such file" not in r.output
            assert (written["trainer"]["num_layers_in_first_pipeline_stage"],
                    written["trainer"]["num_layers_in_last_pipeline_stage"]) == (11, 11)


def test_uneven_stages_that_do_not_add_up_are_refused_by_validate_in_one_line(cli, tmp_path: Path) -> None:
    text = _text(BIG).replace("num_layers_in_last_pipeline_stage=11", "num_layers_in_last_pipeline_stage=12")
    (tmp_path / "s.sh").write_text(text)
    r = cli("import", "verl", tmp_path / "s.sh", "-o", "run.toml")
    assert r.exit_code == 1
    line = next(x for x in r.output.splitlines() if "do not add up" in x)
    assert "11 (first) + 12 (last) leave 71 of the model's 94 layers" in " ".join(r.output.split()), line


def test_the_aux_loss_coefficient_alone_is_noted_as_verl_s_no_op_and_a_balancing_type_maps() -> None:
    geo = convert_script(_text(GEO))
    assert any("moe_aux_loss_coeff=0.01 has no effect" in n for n in geo.notes)
    typed = convert_script(_text(GEO).replace(f"+{TC}.fp8=False", f"+{TC}.moe_router_load_balancing_type=aux_loss"))
    assert typed.values["trainer.moe_router_load_balancing_type"] == "aux_loss" and not typed.errors
    assert not any("has no effect" in n for n in typed.notes)
    bad = convert_script(_text(GEO).replace(f"+{TC}.fp8=False", f"+{TC}.moe_router_load_balancing_type=sinkhorn"))
    assert [why for ov, why in bad.errors] == [
        "MoE load-balancing type 'sinkhorn' is not in asyncrl (none, aux_loss, seq_aux_loss)"]
    legacy = convert_script(_text(GEO).replace(f"+{TC}.fp8=False",
                                               "actor_rollout_ref.actor.megatron.vanilla_mbridge=True"))
    assert [ov for ov, _ in legacy.errors] == ["actor_rollout_ref.actor.megatron.vanilla_mbridge=True"]


def test_dropout_and_the_attention_kernel_map_and_zero_dropout_is_kept() -> None:
    extra = (f"+{TC}.attention_dropout=0.1 +{TC}.hidden_dropout=0.05 "
             "+actor_rollout_ref.model.override_config.embd_pdrop=0.")
    conv = convert_script(_text(GEO).replace(f"+{TC}.fp8=False", extra))
    assert not conv.errors
    assert (conv.values["trainer.attention_dropout"], conv.values["trainer.hidden_dropout"]) == (0.1, 0.05)
    assert conv.values["trainer.use_flash_attn"] is True
    assert any(ov.endswith("embd_pdrop=0.") and "no-op" in why for ov, why in conv.ignored)
    zero = convert_script(_text(GEO).replace(f"+{TC}.fp8=False",
                                             "+actor_rollout_ref.model.override_config.attention_dropout=0."))
    assert zero.values["trainer.attention_dropout"] == 0.0 and not zero.errors


def test_a_reference_layout_of_its_own_is_ignored_with_the_reason() -> None:
    """A layout only splits the computation: the reference's log-probs are the same on the actor's layout."""
    text = _text(BIG).replace("actor_rollout_ref.ref.megatron.tensor_model_parallel_size=4",
                              "actor_rollout_ref.ref.megatron.tensor_model_parallel_size=8")
    conv = convert_script(text)
    assert not conv.errors
    (why,) = [why for ov, why in conv.ignored if ov == "actor_rollout_ref.ref.megatron.tensor_model_parallel_size=8"]
    assert "differs from actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4" in why
    assert "same" in why and "speed and memory only" in why


def test_a_sequence_loss_in_bypass_mode_runs_as_verl_s_workers_run_it() -> None:
    """verl 1dda039: `apply_bypass_mode` sets loss_mode "bypass_mode" in the *trainer's* config; the actor workers
    built their loss from their own copy before, so they run geo_mean / gspo against the rollout log-probs with no
    rollout correction. asyncrl's bypass mode computes the same loss (IS weights as metrics only) — unless
    rejection sampling is asked for, which it would apply: refused, with the way out."""
    geo = convert_script(_text(GEO))
    assert geo.values["trainer.loss_mode"] == "geo_mean" and f"{RC}.bypass_mode" not in geo.values
    assert any("geo_mean against the rollout log-probs" in n for n in geo.notes)
    rs = convert_script(_text(GEO).replace(f"+{TC}.fp8=False", f"{RC}.rollout_rs=token_k1 "
                                           f"{RC}.rollout_rs_threshold=0.6_1.6"))
    assert [ov for ov, _ in rs.errors] == [f"{RC}.rollout_rs=token_k1"]
    assert "bypass_mode=False" in rs.errors[0][1]
    decoupled = convert_script(_text(GEO).replace(f"+{TC}.fp8=False", f"{RC}.bypass_mode=False "
                                                  f"{RC}.rollout_rs=token_k1 {RC}.rollout_rs_threshold=0.6_1.6"))
    assert not decoupled.errors and not any("against the rollout log-probs" in n for n in decoupled.notes)
