"""verl's Qwen3.5 fully-async script (issue 46): the rollout's own length keys equal the data budgets, the
chat-template arguments carry over, and what stays refused says what it would change."""

from __future__ import annotations

import tomllib
from pathlib import Path

from asyncrl_cli.verl_import.convert import convert_script

CORPUS = Path(__file__).parent / "verl_corpus"
QWEN35 = (CORPUS / "grpo_qwen35_35b_megatron_async.sh").read_text()
ROLL = "actor_rollout_ref.rollout"


def test_qwen35_is_refused_only_for_what_asyncrl_cannot_honour_each_saying_why() -> None:
    conv = convert_script(QWEN35, rollout_engine="vllm")
    errors = {ov.split("=")[0]: why for ov, why in conv.errors}
    assert set(errors) == {"actor_rollout_ref.model.mtp.enable", f"{ROLL}.single_turn_response_length",
                           "algorithm.use_kl_in_reward", "actor_rollout_ref.actor.megatron.vanilla_mbridge",
                           f"{ROLL}.multi_turn.max_tool_response_length"}
    assert "no verl code reads it" in errors[f"{ROLL}.single_turn_response_length"]
    assert "from each token's reward" in errors["algorithm.use_kl_in_reward"]
    cut = errors[f"{ROLL}.multi_turn.max_tool_response_length"]
    assert "default middle" in cut and "keeps the head" in cut and "max_output_chars" in cut
    ignored = dict(conv.ignored)
    assert ignored[f"{ROLL}.prompt_length=12288"].startswith("equals data.max_prompt_length")
    assert ignored[f"{ROLL}.response_length=86016"].startswith("equals data.max_response_length")
    assert conv.values["data.apply_chat_template_kwargs"] == {"thinking": True}


def test_a_rollout_length_other_than_the_data_budget_is_refused() -> None:
    conv = convert_script(QWEN35.replace(f"{ROLL}.prompt_length=12288", f"{ROLL}.prompt_length=100"),
                          rollout_engine="vllm")
    (why,) = [why for ov, why in conv.errors if ov.startswith(f"{ROLL}.prompt_length")]
    assert why.startswith("differs from data.max_prompt_length=")


def test_template_kwargs_are_written_into_the_run_file_and_null_is_refused(cli, tmp_path: Path) -> None:
    text = (CORPUS / "dapo_7b_math_fsdp2_8_8.sh").read_text().replace(
        "algorithm.adv_estimator=grpo", "+data.apply_chat_template_kwargs.enable_thinking=False "
        "+data.apply_chat_template_kwargs.reasoning_effort=low algorithm.adv_estimator=grpo")
    (tmp_path / "s.sh").write_text(text)
    r = cli("import", "verl", tmp_path / "s.sh", "-o", "run.toml", "--hardware", "h20")
    assert r.exit_code == 0, r.output
    data = tomllib.loads((tmp_path / "run.toml").read_text())["data"]
    assert data["apply_chat_template_kwargs"] == {"enable_thinking": False, "reasoning_effort": "low"}
    conv = convert_script(text.replace("enable_thinking=False", "enable_thinking=null"))
    assert [why for ov, why in conv.errors if "enable_thinking" in ov] == [
        "null cannot be written into a run file: leave the key out"]
