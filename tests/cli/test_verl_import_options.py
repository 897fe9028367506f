"""`asyncrl import verl`'s two consents: `--row-adapter FILE.py:FN` (the user's plain-Python row adapter in place of
verl's dataset class) and `--rollout-engine vllm` (a TensorRT-LLM / SGLang script run on vLLM), and the one-line
multi-token-prediction refusal. The corpus-wide outcomes are in test_verl_corpus.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncrl_cli.commands.import_ import row_adapter_problem
from asyncrl_cli.verl_import.convert import convert_script

CORPUS = Path(__file__).parent / "verl_corpus"
RETOOL = CORPUS / "dapo_7b_async_retool.sh"
TRT8 = (CORPUS / "grpo_8b_base_math_megatron_4_4_trtllm.sh").read_text()
ROLL = "actor_rollout_ref.rollout"


def _trt8(extra: str) -> str:
    """The 8B TensorRT-LLM script with `extra` overrides on its launch command."""
    return TRT8.replace("async_training.partial_rollout=True", f"async_training.partial_rollout=True {extra}")


@pytest.mark.parametrize(("adapter", "spec", "says"), [
    (None, "missing.py:fn", "--row-adapter 'missing.py:fn': no such file"),
    ("def other(row):\n    return row\n", "adapter.py:fn", "defines no function 'fn' at its top level"),
    ("def fn(row:\n", "adapter.py:fn", "cannot read adapter.py as Python (SyntaxError"),
    ("async def fn(row):\n    return row\n", "adapter.py:fn", "fn is an async def"),
    ("def fn(row):\n    return row\n", "adapter.py", "is not `path/to/file.py:function`"),
])
def test_a_row_adapter_that_cannot_be_used_is_a_usage_error_naming_why(cli, tmp_path: Path, adapter: str | None,
                                                                     spec: str, says: str) -> None:
    if adapter is not None:
        (tmp_path / "adapter.py").write_text(adapter)
    r = cli("import", "verl", RETOOL, "-o", "run.toml", "--row-adapter", spec)
    assert r.exit_code == 2, r.output
    assert says in " ".join(r.stderr.split()) and "Traceback" not in r.output
    assert not (tmp_path / "run.toml").exists()


def test_a_row_adapter_is_found_without_running_the_file(cli, tmp_path: Path) -> None:
    """Defined under a guard, or bound by an import: found statically; the file's code never runs here."""
    (tmp_path / "adapter.py").write_text("raise SystemExit('imported!')\nif True:\n    def fn(row):\n"
                                         "        return row\n")
    r = cli("import", "verl", RETOOL, "-o", "run.toml", "--row-adapter", "adapter.py:fn", "--hardware", "h20")
    assert r.exit_code != 2 and (tmp_path / "run.toml").exists(), r.output
    (tmp_path / "b.py").write_text("from adapter import fn as fn\n")
    assert row_adapter_problem("b.py:fn") is None


def test_the_custom_class_s_keys_are_listed_as_replaced_by_the_adapter() -> None:
    conv = convert_script(RETOOL.read_text(), row_adapter="adapter.py:fn")
    assert not conv.errors and conv.values["data.row_adapter"] == "adapter.py:fn"
    assert [ov for ov, why in conv.ignored if "replaced by data.row_adapter" in why] == [
        "data.custom_cls.path=recipe/retool/retool.py", "data.custom_cls.name=CustomRLHFDataset"]
    plain = convert_script((CORPUS / "dapo_7b_math_fsdp2_8_8.sh").read_text(), row_adapter="adapter.py:fn")
    assert plain.values["data.row_adapter"] == "adapter.py:fn"
    assert any("the script has no data.custom_cls" in n for n in plain.notes)


def test_only_vllm_may_replace_an_engine(cli, tmp_path: Path) -> None:
    r = cli("import", "verl", CORPUS / "grpo_8b_base_math_megatron_4_4_trtllm.sh", "-o", "run.toml",
            "--rollout-engine", "sglang")
    assert r.exit_code == 2 and "asyncrl runs vllm in place of" in " ".join(r.stderr.split())


def test_without_the_option_the_engine_is_refused_naming_it() -> None:
    (why,) = [why for ov, why in convert_script(TRT8).errors if ov == f"{ROLL}.name=trtllm"]
    assert why.startswith("TensorRT-LLM (rollout.name=trtllm) is not an asyncrl rollout backend: "
                          "pass --rollout-engine vllm")


def test_an_engine_setting_the_importer_does_not_know_is_an_error_even_when_replaced() -> None:
    text = TRT8.replace(f"{ROLL}.name=trtllm", f"{ROLL}.name=trtllm +{ROLL}.engine_kwargs.trtllm.sampler_type=X")
    conv = convert_script(text, rollout_engine="vllm")
    assert [ov for ov, _ in conv.errors] == [f"{ROLL}.engine_kwargs.trtllm.sampler_type=X"]
    assert "may change sampling or precision" in conv.errors[0][1]


def test_another_engine_s_settings_in_a_vllm_script_have_no_effect() -> None:
    text = (CORPUS / "dapo_7b_math_fsdp2_8_8.sh").read_text()
    text = text.replace("trainer.total_epochs=", f"+{ROLL}.engine_kwargs.sglang.foo=1 trainer.total_epochs=", 1)
    for engine in (None, "vllm"):  # the option changes nothing for a vLLM script
        conv = convert_script(text, rollout_engine=engine)
        assert not conv.errors and not conv.warnings and conv.values["rollout.backend"] == "vllm"
        assert (f"{ROLL}.engine_kwargs.sglang.foo=1", "configures SGLang, which the script does not run") \
            in conv.ignored


def test_an_engine_keyword_wins_over_the_core_key_it_replaces() -> None:
    """verl unpacks engine_kwargs last: SGLang's max_running_requests wins over rollout.max_num_seqs."""
    text = TRT8.replace(f"{ROLL}.name=trtllm", f"{ROLL}.name=sglang "
                        f"+{ROLL}.engine_kwargs.sglang.max_running_requests=64")
    conv = convert_script(text, rollout_engine="vllm")
    assert not conv.errors and conv.values["rollout.max_num_seqs"] == 64
    assert (f"{ROLL}.max_num_seqs=2048", f"{ROLL}.engine_kwargs.sglang.max_running_requests wins over it, in verl "
            "as here") in conv.ignored
    assert any("SGLang (rollout.name=sglang) replaced by vLLM" in w for w in conv.warnings)


def test_mtp_heads_only_loaded_have_no_effect_and_trained_ones_are_one_refusal() -> None:
    mtp = "actor_rollout_ref.model.mtp"
    loaded = convert_script(_trt8(f"{mtp}.enable=True {mtp}.enable_train=False"), rollout_engine="vllm")
    assert not loaded.errors
    assert any(ov == f"{mtp}.enable=True {mtp}.enable_train=False" and "no effect" in why
               for ov, why in loaded.ignored)
    trained = convert_script(_trt8(f"{mtp}.enable=True {mtp}.enable_train=True {mtp}.mtp_loss_scaling_factor=0.1"),
                             rollout_engine="vllm")
    assert trained.errors == [(f"{mtp}.enable=True {mtp}.enable_train=True {mtp}.mtp_loss_scaling_factor=0.1",
                               "multi-token prediction is not in asyncrl: training the MTP heads adds their loss "
                               "to the policy loss (another objective)")]
