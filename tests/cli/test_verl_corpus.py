"""The conformance corpus: for each of verl's fully-async launch scripts (written out as our own key=value
scripts under `verl_corpus/`, each naming its source path and revision), the expected outcome of
`asyncrl import verl` — the resolved asyncrl values of the keys that define the experiment and a run file that
validates, or the exact refusal. None may convert into a different experiment with exit 0."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from asyncrl_cli.verl_import.convert import convert_script, overrides_of
from asyncrl_cli.verl_import.shell import parse_script

CORPUS = Path(__file__).parent / "verl_corpus"

DAPO_REWARD = {"data.reward_manager": "dapo", "data.overlong_buffer.enable": True, "data.overlong_buffer.len": 4096,
               "data.overlong_buffer.penalty_factor": 1.0, "data.overlong_buffer.log": False}
GRPO_30B = {
    "trainer.backend": "megatron", "trainer.tp": 2, "trainer.pp": 1, "trainer.cp": 2, "trainer.ep": 8, "trainer.etp": 1,
    "data.max_prompt_length": 2048, "data.max_response_length": 8192, "data.filter_overlong_prompts": False,
    "rollout.n": 16, "rollout.temperature": 1.0, "rollout.top_p": 1.0, "rollout.top_k": 0,
    "rollout.tensor_parallel_size": 4, "rollout.val_temperature": 1.0, "rollout.val_top_p": 0.7,
    "algorithm.adv_estimator": "grpo", "trainer.use_kl_loss": True, "trainer.kl_loss_coef": 0.001,
    "trainer.clip_ratio_low": 0.2, "trainer.clip_ratio_high": 0.28, "trainer.clip_ratio_c": 10.0,
    "trainer.loss_agg_mode": "token-mean", "trainer.entropy_coeff": 0.0, "trainer.ppo_mini_batch_size": 128,
    "trainer.use_dynamic_bsz": True, "trainer.ppo_max_token_len_per_gpu": 10240,
    "trainer.log_prob_max_token_len_per_gpu": 10240, "trainer.ref_param_offload": True,
    "trainer.optim.lr": 1e-6, "trainer.optim.warmup_steps": 10, "trainer.optim.weight_decay": 0.1,
    "resources.trainer.nnodes": 4, "resources.trainer.gpus_per_node": 8,
    "resources.rollout.nnodes": 12, "resources.rollout.gpus_per_node": 8, "rollout.total_rollout_steps": 204800,
    "trainer.total_epochs": 10, "trainer.test_freq": 20, "trainer.val_before_train": True,
    "async_training.staleness_threshold": 0.5, "async_training.trigger_parameter_sync_step": 4,
    "async_training.require_batches": 1, "async_training.partial_rollout": True, **DAPO_REWARD,
}
DAPO_7B_4_4 = {
    "trainer.backend": "torch", "trainer.enable_gradient_checkpointing": True, "data.max_prompt_length": 2048,
    "data.max_response_length": 8192, "data.filter_overlong_prompts": False, "rollout.n": 16,
    "rollout.tensor_parallel_size": 1, "rollout.gpu_memory_utilization": 0.8, "rollout.val_top_p": 0.7,
    "trainer.use_kl_loss": False, "trainer.clip_ratio_high": 0.28, "trainer.clip_ratio_c": 10.0,
    "trainer.ppo_mini_batch_size": 32, "trainer.use_dynamic_bsz": True, "trainer.ppo_max_token_len_per_gpu": 20480,
    "trainer.log_prob_max_token_len_per_gpu": 30720, "trainer.grad_clip": 1.0,
    "resources.trainer.nnodes": 1, "resources.trainer.gpus_per_node": 4,
    "resources.rollout.nnodes": 1, "resources.rollout.gpus_per_node": 4, "rollout.total_rollout_steps": 51200,
    "trainer.test_freq": 10, "trainer.val_before_train": False, "async_training.staleness_threshold": 0.1,
    "async_training.require_batches": 4, **DAPO_REWARD,
}
GEO3K = {
    "trainer.backend": "torch", "data.image_key": "images", "data.shuffle": False, "data.filter_overlong_prompts": True,
    "trainer.kl_loss_coef": 0.01, "trainer.use_dynamic_bsz": True, "trainer.ppo_max_token_len_per_gpu": 16384,
    "rollout.n": 4, "rollout.total_rollout_steps": 51200, "resources.trainer.gpus_per_node": 12,
    "resources.rollout.gpus_per_node": 4, "algorithm.rollout_correction.rollout_is": "sequence",
    "algorithm.rollout_correction.rollout_rs": "token_k1", "algorithm.rollout_correction.rollout_rs_threshold": "0.6_1.6",
    "async_training.require_batches": 2,
}
SP = ("actor_rollout_ref.actor.ulysses_sequence_parallel_size", "actor_rollout_ref.ref.ulysses_sequence_parallel_size")

# script: (hardware, expected exit code of `asyncrl import verl`, resolved values | None, refused keys | why)
EXPECTED: dict[str, tuple[str | None, int, dict | None, tuple[str, ...]]] = {
    "grpo_30b_a3b_base_math_megatron_96_32": ("h20", 0, GRPO_30B, ()),
    "grpo_30b_a3b_base_math_megatron_96_32_mis": ("h20", 0, {
        **GRPO_30B, "algorithm.rollout_correction.rollout_rs": "seq_mean_k1",
        "algorithm.rollout_correction.rollout_rs_threshold": "0.999_1.001"}, ()),
    "dapo_7b_math_fsdp2_4_4": ("h20", 0, DAPO_7B_4_4, ()),
    # converts faithfully; validate refuses it: 64 prompts × n 4 do not split over 12 trainer ranks
    "geo3k_qwen3vl_8b_fsdp2_16_16_npu": (None, 1, GEO3K, ("do not split evenly over 12 data-parallel ranks",)),
    # Ulysses SP 4 (actor and reference) over 64 trainer ranks: 16 data-parallel groups
    "dapo_7b_math_fsdp2_64_64_mis": (None, 0, {
        "trainer.backend": "torch", "trainer.ulysses_sequence_parallel_size": 4, "trainer.use_dynamic_bsz": True,
        "trainer.ppo_max_token_len_per_gpu": 61440, "trainer.log_prob_max_token_len_per_gpu": 92160,
        "resources.trainer.nnodes": 8, "resources.trainer.gpus_per_node": 8}, ()),
    # verl shares 16 devices between the pools by partition; a plain import would ask for 24
    "geo3k_qwen3vl_8b_fsdp2_hybrid_res_pool_npu": (None, 1, None, ("async_training.hybrid_res_pool",
                                                                   "actor_rollout_ref.partition")),
    # its base config, fully_async_dapo_trainer, is not in verl: the importer knows its defaults are
    # fully_async_ppo_trainer's (every DAPO setting is an override) and says so
    "dapo_30b_a3b_base_math_fsdp": ("h100", 0, {"trainer.backend": "torch", "rollout.n": 16,
                                                "trainer.ulysses_sequence_parallel_size": 4}, ()),
    # the multi-turn keys map onto [rollout.multi_turn] and val_kwargs onto rollout.val_* (test_retool_multi_turn_
    # keys_map); the custom dataset class is refused, naming --row-adapter (test_custom_cls_names_the_row_adapter;
    # with it the script converts: test_the_retool_script_converts_with_a_row_adapter_into_a_multi_turn_run)
    "dapo_7b_async_retool": (None, 1, None, ("data.custom_cls.path", "data.custom_cls.name")),
    # uneven pipeline stages (11 + 6 × 12 + 11 of Qwen3-235B's 94 layers); no gsm8k data here, and on the
    # 64 GB Ascend 910C the trainer does not fit: verl offloads the parameters, gradients and optimizer state
    # to host memory between phases, asyncrl's Megatron trainer keeps them on the device (its optimizer offload
    # is CUDA's; test_the_megatron_scripts_validate_with_their_data)
    "grpo_qwen3_235b_megatron_npu": (None, 1, {
        "trainer.backend": "megatron", "trainer.tp": 4, "trainer.pp": 8, "trainer.ep": 4,
        "trainer.num_layers_in_first_pipeline_stage": 11, "trainer.num_layers_in_last_pipeline_stage": 11},
        ("data.train_files", "but 'ascend-910c' has 64 GB")),
    # verl-project/verl 1dda039 (2026-08-22): the scripts added since
    "dapo_7b_math_fsdp2_8_8": ("h20", 0, {
        "trainer.backend": "torch", "rollout.n": 16, "trainer.ppo_mini_batch_size": 32, "trainer.use_kl_loss": False,
        "trainer.ppo_max_token_len_per_gpu": 20480, "rollout.tensor_parallel_size": 1, **DAPO_REWARD,
        "resources.trainer.gpus_per_node": 8, "resources.rollout.gpus_per_node": 8}, ()),
    # converts faithfully; validate refuses it as verl's engine workers assert (mini-batch % data-parallel size)
    "dapo_7b_math_fsdp2_4_12": ("h20", 1, {"trainer.ppo_mini_batch_size": 32, "rollout.n": 16,
                                           "resources.trainer.nnodes": 2, "resources.trainer.gpus_per_node": 6,
                                           "resources.rollout.nnodes": 2, "resources.rollout.gpus_per_node": 2},
                                ("do not split evenly over 12 data-parallel ranks",)),
    **{f"dapo_7b_math_fsdp2_{n}_{n}": ("h100", 0, {"rollout.n": 16, "trainer.ulysses_sequence_parallel_size": 4}, ())
       for n in (16, 32, 64)},
    # rollout expert parallelism and Ulysses SP convert; no geo3k / DAPO data here, so validate stops there
    "dapo_30b_a3b_math_fsdp_npu": (None, 1, {"trainer.ulysses_sequence_parallel_size": 8,
                                             "rollout.expert_parallel_size": 2}, ("data.train_files",)),
    "geo3k_qwen3vl_30b_a3b_fsdp2_32_32": (None, 1, {"trainer.ulysses_sequence_parallel_size": 8,
                                                    "rollout.expert_parallel_size": 2}, ("data.train_files",)),
    "geo3k_qwen25vl_7b_megatron_4_4": (None, 1, {
        "trainer.backend": "megatron", "trainer.tp": 2, "trainer.kl_loss_coef": 0.01, "trainer.kl_loss_type":
        "low_var_kl", "trainer.ppo_mini_batch_size": 128, "trainer.ppo_max_token_len_per_gpu": 5120, "rollout.n": 4,
        "rollout.tensor_parallel_size": 1, "data.image_key": "images", "resources.trainer.gpus_per_node": 4,
        "resources.rollout.gpus_per_node": 4}, ("data.train_files",)),
    # GMPO in bypass mode (as verl's workers run it), the router's z-loss (its load-balancing coefficient has no
    # effect, in verl as here: load-balancing type "none"), flash attention, token budgets through PP 2
    "geo3k_qwen3vl_30b_megatron_6_2_npu_async": (None, 1, {
        "trainer.backend": "megatron", "trainer.loss_mode": "geo_mean", "trainer.moe_aux_loss_coeff": 0.01,
        "trainer.moe_z_loss_coeff": 0.001, "trainer.use_flash_attn": True, "trainer.tp": 4, "trainer.pp": 2,
        "trainer.ep": 4, "trainer.use_dynamic_bsz": True, "trainer.ppo_max_token_len_per_gpu": 17408},
        ("data.train_files",)),
    # the TensorRT-LLM rollout engine: refused, naming --rollout-engine vllm (WITH_OPTIONS: they convert with it)
    "grpo_30b_a3b_base_math_megatron_8_8_mis_trtllm": (None, 1, None, ("actor_rollout_ref.rollout.name",)),
    "grpo_8b_base_math_megatron_4_4_trtllm": (None, 1, None, ("actor_rollout_ref.rollout.name",)),
}
REFUSED_MANY = ("grpo_qwen35_35b_megatron_async", "run_qwen35_35b_a3b_math_dynamic_megatron",
                "run_mimo_7b_mtp_fully_async_megatron_multinode")
"""Scripts refused for many keys (SGLang, multi-token prediction, dynamic scaling): their refusals are checked by
`test_sglang_mtp_and_dynamic_scaling_scripts_are_refused_with_their_reasons` (grpo_qwen35_35b_megatron_async's
others, and its mapped and ignored keys, by test_verl_import_qwen35.py)."""


def test_the_corpus_is_the_one_the_table_describes() -> None:
    assert {p.stem for p in CORPUS.glob("*.sh")} == set(EXPECTED) | set(REFUSED_MANY)
    for p in CORPUS.glob("*.sh"):
        head = p.read_text().splitlines()[:3]
        assert "verl" in head[1] and "@" in head[1], p  # source path @ repository revision


@pytest.mark.parametrize("name", sorted(EXPECTED) + sorted(REFUSED_MANY))
def test_every_override_is_accounted_for(name: str) -> None:
    """Mapped, ignored with a reason, or an error: none is dropped."""
    text = (CORPUS / f"{name}.sh").read_text()
    conv = convert_script(text)
    overrides, _ = overrides_of(parse_script(text))
    seen = " ".join([*conv.sources.values(), *(ov for ov, _ in conv.ignored), *(ov for ov, _ in conv.errors)])
    for ov in overrides:
        assert ov.partition("=")[0].lstrip("+~") in seen, ov
    assert all(why for _, why in conv.ignored + conv.errors)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_import_outcome(cli, tmp_path: Path, name: str) -> None:
    hardware, code, values, refused = EXPECTED[name]
    args = ["import", "verl", CORPUS / f"{name}.sh", "-o", "run.toml"] + (["--hardware", hardware] if hardware else [])
    r = cli(*args)
    assert r.exit_code == code, r.output
    conv = convert_script((CORPUS / f"{name}.sh").read_text())
    if values is None:  # refused before anything is written, every reason listed
        assert not (tmp_path / "run.toml").exists()
        assert {ov.partition("=")[0] for ov, _ in conv.errors} == set(refused)
        for key in refused:
            assert key in r.stderr
        return
    assert not conv.errors
    for key, want in values.items():
        assert conv.values[key] == want, key
    written = tomllib.loads((tmp_path / "run.toml").read_text())
    for key, want in values.items():
        node = written
        for part in key.split("."):
            node = node[part]
        assert node == want, key
    for why in refused:  # a faithful file that validate refuses, with the reason
        assert why in r.output


RETOOL_MULTI_TURN = {"rollout.multi_turn.enable": True, "rollout.multi_turn.max_user_turns": 16,
                     "rollout.multi_turn.max_assistant_turns": 16, "rollout.multi_turn.format": "hermes",
                     "rollout.multi_turn.tool_config_path": "recipe/retool/sandbox_fusion_tool_config.yaml"}


def test_retool_multi_turn_keys_map() -> None:
    """verl's retool script: its multi-turn keys land on [rollout.multi_turn] under the same names; what stops
    it without --row-adapter is the custom dataset class. Its 30 validation answers per prompt at temperature 1.0,
    top-p 0.6 map onto rollout.val_* (verl's fully-async agent loop samples them whatever do_sample says)."""
    conv = convert_script((CORPUS / "dapo_7b_async_retool.sh").read_text())
    for key, want in RETOOL_MULTI_TURN.items():
        assert conv.values[key] == want, key
    assert not [ov for ov, _ in conv.errors if "multi_turn" in ov or "val_kwargs" in ov]
    assert (conv.values["rollout.val_n"], conv.values["rollout.val_temperature"], conv.values["rollout.val_top_p"]) \
        == (30, 1.0, 0.6)


def test_custom_cls_names_the_row_adapter_and_its_signature() -> None:
    conv = convert_script((CORPUS / "dapo_7b_async_retool.sh").read_text())
    (reason,) = {why for ov, why in conv.errors if ov.startswith("data.custom_cls.path=")}
    assert 'data.row_adapter = "file.py:fn"' in reason and "def fn(row: dict) -> dict" in reason
    assert "pass it with --row-adapter file.py:fn" in reason


def _with(extra: str) -> str:
    """The retool script with its refused keys taken out and `extra` overrides added."""
    text = (CORPUS / "dapo_7b_async_retool.sh").read_text()
    for gone in ("data.custom_cls.path=$retool_path", "data.custom_cls.name=CustomRLHFDataset",
                 "actor_rollout_ref.actor.ulysses_sequence_parallel_size=4"):
        text = text.replace(gone, "")
    return text.replace("async_training.partial_rollout=True", f"async_training.partial_rollout=True {extra}")


def test_multi_turn_keys_asyncrl_cannot_honour_are_refused_with_the_reason() -> None:
    conv = convert_script(_with("actor_rollout_ref.rollout.multi_turn.max_parallel_calls=2"))
    assert conv.errors == [] and conv.values["rollout.multi_turn.max_parallel_calls"] == 2
    conv = convert_script(_with(
        "actor_rollout_ref.rollout.multi_turn.interaction_config_path=recipe/gsm8k_interaction.yaml "
        "actor_rollout_ref.rollout.multi_turn.format=gpt-oss "
        "actor_rollout_ref.rollout.agent.agent_loop_config_path=my_loops.yaml"))
    why = {ov.partition("=")[0].rsplit(".", 1)[-1]: reason for ov, reason in conv.errors}
    assert "interaction" in why["interaction_config_path"]
    assert "hermes" in why["format"]
    assert "agent loop" in why["agent_loop_config_path"]


def test_a_tool_config_with_a_custom_tool_class_is_refused_without_its_file(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tools.yaml").write_text(
        "tools:\n  - class_name: my_pkg.search_tool.SearchTool\n    config: {}\n"
        "    tool_schema: {type: function, function: {name: search, parameters: {}}}\n")
    conv = convert_script(_with("actor_rollout_ref.rollout.multi_turn.tool_config_path=tools.yaml").replace(
        "actor_rollout_ref.rollout.multi_turn.tool_config_path=recipe/retool/sandbox_fusion_tool_config.yaml", ""))
    assert [(ov, "SearchTool" in why) for ov, why in conv.errors] == [
        ("actor_rollout_ref.rollout.multi_turn.tool_config_path=tools.yaml", True)]
    # the same config with the class's file at hand (as verl's scripts run beside it): a stateful tool of the
    # user's, found without being imported
    (tmp_path / "my_pkg").mkdir()
    (tmp_path / "my_pkg" / "search_tool.py").write_text("raise SystemExit('imported!')\nclass SearchTool:\n    pass\n")
    conv = convert_script(_with("actor_rollout_ref.rollout.multi_turn.tool_config_path=tools.yaml").replace(
        "actor_rollout_ref.rollout.multi_turn.tool_config_path=recipe/retool/sandbox_fusion_tool_config.yaml", ""))
    assert conv.errors == []


SANDBOX_TOOL = (
    "tools:\n  - class_name: verl.tools.sandbox_fusion_tools.SandboxFusionTool\n"
    "    config: {sandbox_fusion_url: 'http://localhost:8080/run_code', default_timeout: 30}\n"
    "    tool_schema:\n      type: function\n      function:\n        name: code_interpreter\n"
    "        description: A tool for executing code.\n        parameters:\n          type: object\n"
    "          properties: {code: {type: string, description: The code to execute.}}\n"
    "          required: [code]\n")
"""verl's retool tool config (the sandbox-fusion code interpreter on the service it names)."""


def test_the_converted_retool_run_validates(cli, tmp_path: Path) -> None:
    """With the refused keys taken out, the retool script converts into a multi-turn run file that validates
    (its verl tool config and reward module at hand, as in verl's root: the sandbox-fusion code interpreter on
    the service its config names)."""
    cfg = tmp_path / "recipe" / "retool"
    cfg.mkdir(parents=True)
    (cfg / "retool.py").write_text("def compute_score(response_text, ground_truth, **kwargs):\n"
                                   "    return float(str(ground_truth) in response_text)\n")
    (cfg / "sandbox_fusion_tool_config.yaml").write_text(SANDBOX_TOOL)
    script = tmp_path / "retool.sh"
    script.write_text(_with(""))
    r = cli("import", "verl", script, "-o", "run.toml", "--hardware", "h20")
    assert r.exit_code == 0, r.output
    written = tomllib.loads((tmp_path / "run.toml").read_text())
    assert written["rollout"]["multi_turn"] == {k.rsplit(".", 1)[-1]: v for k, v in RETOOL_MULTI_TURN.items()}
    # verl's config names its SandboxFusion service: the run uses it (never the local box), and the import says so
    assert "SandboxFusion at http://localhost:8080/run_code" in " ".join(r.output.split())


@pytest.mark.parametrize("name", REFUSED_MANY)
def test_sglang_mtp_and_dynamic_scaling_scripts_are_refused_with_their_reasons(cli, name: str) -> None:
    """SGLang is refused naming --rollout-engine vllm; with it, multi-token prediction stays refused, in one line
    (training the MTP heads changes the loss; speculative decoding with them is not in asyncrl), and every SGLang
    engine setting of the script is mapped or dropped with its reason."""
    r = cli("import", "verl", CORPUS / f"{name}.sh", "-o", "run.toml")
    assert r.exit_code == 1 and "nothing was written" in r.stderr
    text = (CORPUS / f"{name}.sh").read_text()
    reasons = " ".join(why for _, why in convert_script(text).errors)
    assert "SGLang (rollout.name=sglang) is not an asyncrl rollout backend: pass --rollout-engine vllm" in reasons
    assert "multi-token prediction is not in asyncrl" in reasons
    if "dynamic" in name:
        assert "dynamic resource scaling" in reasons
    r = cli("import", "verl", CORPUS / f"{name}.sh", "-o", "run.toml", "--rollout-engine", "vllm")
    assert r.exit_code == 1 and "nothing was written" in r.stderr
    conv = convert_script(text, rollout_engine="vllm")
    (mtp,) = [(ov, why) for ov, why in conv.errors if "actor_rollout_ref.model.mtp." in ov]
    assert mtp[1].startswith("multi-token prediction is not in asyncrl: ") and "speculative decoding" in mtp[1]
    assert ("training the MTP heads adds their loss" in mtp[1]) == ("mtp.enable_train=True" in mtp[0])
    assert " ".join(mtp[1].split()) in " ".join(r.stderr.split())
    assert not [ov for ov, _ in conv.errors if "sglang" in ov or "rollout.name" in ov]
    dropped = [why for ov, why in conv.ignored if ".engine_kwargs.sglang." in ov]
    assert all("speed" in why or "memory" in why for why in dropped)
    if "dynamic" in name:  # SGLang's max_running_requests is vLLM's max_num_seqs
        assert conv.values["rollout.max_num_seqs"] == 128 and len(dropped) == 5


def test_pwd_is_the_directory_import_runs_from_and_the_file_says_so(cli, tmp_path: Path) -> None:
    """`$(pwd)` in a script means where it runs: the directory `asyncrl import` runs from, noted in the file."""
    text = (CORPUS / "dapo_7b_math_fsdp2_8_8.sh").read_text()
    text = re.sub(r"'?trainer\.default_local_dir=[^\s']+'?", "trainer.default_local_dir=$(pwd)/ckpts", text)
    (tmp_path / "s.sh").write_text(text)
    r = cli("import", "verl", tmp_path / "s.sh", "-o", "run.toml", "--hardware", "h20")
    assert r.exit_code == 0, r.output
    written = (tmp_path / "run.toml").read_text()
    assert tomllib.loads(written)["checkpoint"]["dir"] == f"{tmp_path}/ckpts"
    assert f"$(pwd) resolved as {tmp_path}" in written


def test_a_run_name_built_by_a_command_keeps_asyncrl_s_default(cli, tmp_path: Path) -> None:
    text = (CORPUS / "dapo_7b_math_fsdp2_8_8.sh").read_text()
    text = re.sub(r"trainer\.experiment_name=\S+", "'trainer.experiment_name=run-$(date +%Y%m%d)'", text)
    conv = convert_script(text)
    assert not conv.errors and "name" not in conv.values
    assert any(ov.startswith("trainer.experiment_name=") and "default" in why for ov, why in conv.ignored)


def test_an_array_element_list_never_hangs_the_reader() -> None:
    """`CMD=(python)` then `"${CMD[@]}" -m verl…`: the launch is found; an operator inside a list is skipped."""
    text = ("LAUNCH=(python)\nBAD=(a ; b)\n\"${LAUNCH[@]}\" -m verl.experimental.fully_async_policy.fully_async_main "
            "algorithm.adv_estimator=grpo data.train_batch_size=0\n")
    conv = convert_script(text)
    assert conv.found_launch and conv.values["algorithm.adv_estimator"] == "grpo"


def test_policy_loss_modes_convert_and_others_are_refused_naming_the_supported_ones() -> None:
    """verl's GSPO / GMPO scripts carry their loss over; a loss asyncrl lacks is refused, never dropped."""
    geo = convert_script((CORPUS / "geo3k_qwen3vl_30b_megatron_6_2_npu_async.sh").read_text())
    gspo = convert_script((CORPUS / "grpo_qwen35_35b_megatron_async.sh").read_text())
    assert geo.values["trainer.loss_mode"] == "geo_mean" and gspo.values["trainer.loss_mode"] == "gspo"
    assert gspo.values["trainer.loss_agg_mode"] == "seq-mean-token-mean"
    assert not any("loss_mode" in ov for ov, _ in geo.errors + gspo.errors)
    sapo = convert_script("python3 -m verl.trainer.main_ppo algorithm.adv_estimator=grpo "
                          "actor_rollout_ref.actor.policy_loss.loss_mode=sapo")
    assert [why for ov, why in sapo.errors if "loss_mode" in ov] == [
        "policy loss 'sapo' is not in asyncrl (supported: vanilla, gspo, geo_mean)"]


def test_ulysses_maps_and_the_reference_shares_it() -> None:
    """verl's Ulysses size converts (the retool script's too); a reference with another size converts onto the
    actor's size (a layout: the same log-probs), the difference noted."""
    retool = convert_script((CORPUS / "dapo_7b_async_retool.sh").read_text())
    assert retool.values["trainer.ulysses_sequence_parallel_size"] == 4
    assert not [ov for ov, _ in retool.errors if ov.startswith(SP[0])]
    text = (CORPUS / "dapo_7b_math_fsdp2_64_64_mis.sh").read_text()
    differs = convert_script(text.replace(f"{SP[1]}=4", f"{SP[1]}=2"))
    assert not [ov for ov, _ in differs.errors if ov.startswith(SP[1])]
    assert [why for ov, why in differs.ignored if ov.startswith(SP[1])][0].startswith(
        f"differs from {SP[0]}=4: the reference's own Ulysses size")


# --- with the options a user needs (`--row-adapter`, `--rollout-engine vllm`) ---------------------------------------

FOUR = ("SGLang (rollout.name=sglang) is not an asyncrl rollout backend", "separate log-prob server",
        "hybrid resource pool", "dynamic resource scaling")
"""The refusals issue 46 keeps (SGLang, verl's log-prob server, the hybrid resource pool, dynamic scaling)."""
MTP = "multi-token prediction is not in asyncrl"
OPTIONS = {"dapo_7b_async_retool": {"row_adapter": "adapter.py:fn"},
           **{name: {"rollout_engine": "vllm"} for name in (*REFUSED_MANY, "grpo_8b_base_math_megatron_4_4_trtllm",
                                                            "grpo_30b_a3b_base_math_megatron_8_8_mis_trtllm")}}
"""What a user passes to convert each script that needs it (the sglang ones stay refused for MTP)."""
LIFTED_BY = {"data.custom_cls": "--row-adapter file.py:fn", "rollout.name": "--rollout-engine vllm"}
"""The refusals an option lifts, and the option their message names."""
REFUSED_WITH_OPTIONS = {"geo3k_qwen3vl_8b_fsdp2_hybrid_res_pool_npu", *REFUSED_MANY}


@pytest.mark.parametrize("name", sorted(EXPECTED) + sorted(REFUSED_MANY))
def test_every_script_converts_with_the_options_it_needs_or_is_refused_for_one_of_the_four_or_mtp(name: str) -> None:
    """Without its options, a script converts, is refused for one of the four reasons or MTP, or only for what
    an option lifts (each such refusal naming the option); with them it converts, or is refused for one of the
    four or MTP. (grpo_qwen35_35b_megatron_async, refused for MTP, has other refusals besides.)"""
    text = (CORPUS / f"{name}.sh").read_text()
    errors = convert_script(text).errors
    lifts = [next((opt for key, opt in LIFTED_BY.items() if key in ov), None) for ov, _ in errors]
    assert all(opt in why for opt, (_, why) in zip(lifts, errors, strict=True) if opt)
    assert all(lifts) or any(r in why for _, why in errors for r in (*FOUR, MTP)), errors
    reasons = [why for _, why in convert_script(text, **OPTIONS.get(name, {})).errors]
    if name in REFUSED_WITH_OPTIONS:
        assert any(r in why for why in reasons for r in (*FOUR, MTP)), reasons
    else:
        assert reasons == []


def _rows(path: Path, n: int = 64) -> None:
    """n rows in verl's layout (a math question and its answer)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    messages = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
    pq.write_table(pa.table({"prompt": pa.array([[{"role": "user", "content": "What is 2 + 3?"}]] * n, messages),
                             "data_source": pa.array(["math_dapo"] * n),
                             "reward_model": pa.array([{"style": "rule", "ground_truth": "5"}] * n)}), path)


TRTLLM = {
    # verl ran them on GB200 (4 × 186 GB per compute tray), as the import guesses from their names
    "grpo_8b_base_math_megatron_4_4_trtllm": {
        "rollout.backend": "vllm", "trainer.backend": "megatron", "trainer.tp": 2, "trainer.pp": 1,
        "rollout.tensor_parallel_size": 2, "rollout.n": 16, "rollout.val_n": 4, "rollout.max_num_seqs": 2048,
        "rollout.gpu_memory_utilization": 0.7, "rollout.weight_sync_bucket_mb": 4096,
        "algorithm.rollout_correction.bypass_mode": False, "algorithm.rollout_correction.rollout_is": "token",
        "resources.trainer.gpus_per_node": 4, "resources.rollout.gpus_per_node": 4},
    "grpo_30b_a3b_base_math_megatron_8_8_mis_trtllm": {
        "rollout.backend": "vllm", "trainer.backend": "megatron", "trainer.tp": 2, "trainer.ep": 4,
        "rollout.tensor_parallel_size": 4, "rollout.n": 16, "rollout.val_n": 4,
        "algorithm.rollout_correction.rollout_rs": "seq_mean_k1",
        "algorithm.rollout_correction.rollout_rs_threshold": "0.999_1.001",
        "resources.trainer.nnodes": 2, "resources.trainer.gpus_per_node": 4, "resources.rollout.nnodes": 2},
}


@pytest.mark.parametrize("name", sorted(TRTLLM))
def test_the_trtllm_scripts_convert_on_vllm_with_the_substitution_written_and_warned(cli, tmp_path: Path,
                                                                                      name: str) -> None:
    """`--rollout-engine vllm`: the TensorRT-LLM script converts with vLLM as its engine, the substitution at the
    top of the file and printed as a warning naming what may differ; its TensorRT-LLM scheduler settings are
    dropped with their reason; with its data where it points (its model is one asyncrl knows), it validates."""
    for split in ("dapo-math-17k", "aime-2024"):
        _rows(tmp_path / "data" / f"{split}.parquet")
    r = cli("import", "verl", CORPUS / f"{name}.sh", "-o", "run.toml", "--rollout-engine", "vllm")
    assert r.exit_code == 0, r.output
    text = (tmp_path / "run.toml").read_text()
    written = tomllib.loads(text)
    assert written["resources"]["hardware"] == "gb200"
    for key, want in TRTLLM[name].items():
        node = written
        for part in key.split("."):
            node = node[part]
        assert node == want, key
    head = text.split("\n[", 1)[0]
    assert "WARNING" in head and "TensorRT-LLM (rollout.name=trtllm) replaced by vLLM" in head
    assert "kernels and numerics" in head and "rollout_corr/kl" in head and "stop tokens" in head
    out = " ".join(r.output.split())
    assert "warning rollout engine: TensorRT-LLM (rollout.name=trtllm) replaced by vLLM" in out
    assert "may differ: the kernels and numerics" in out
    assert "no such file" not in out
    conv = convert_script((CORPUS / f"{name}.sh").read_text(), rollout_engine="vllm")
    trt = [(ov, why) for ov, why in conv.ignored if ".engine_kwargs.trtllm." in ov]
    assert all("speed only" in why for _, why in trt) and len(trt) == (2 if "30b" in name else 0)
    if trt:
        assert "dropped TensorRT-LLM settings" in head and "batch_wait_timeout_iters" in head


def test_the_retool_script_converts_with_a_row_adapter_into_a_multi_turn_run(cli, tmp_path: Path) -> None:
    """verl's retool script as it is, in one command with the user's row adapter in place of verl's dataset
    class: a multi-turn run with 30 validation answers per prompt that validates (its tool config, reward
    module, data and the adapter at hand, as in verl's root)."""
    cfg = tmp_path / "recipe" / "retool"
    cfg.mkdir(parents=True)
    (cfg / "retool.py").write_text("def compute_score(response_text, ground_truth, **kwargs):\n"
                                   "    return float(str(ground_truth) in response_text)\n")
    (cfg / "sandbox_fusion_tool_config.yaml").write_text(SANDBOX_TOOL)
    (tmp_path / "adapter.py").write_text(
        "def fn(row):\n"  # AIME's raw columns → verl's layout
        "    return {'prompt': [{'role': 'user', 'content': row['Problem']}], 'data_source': 'aime',\n"
        "            'reward_model': {'ground_truth': str(row['Answer'])}}\n")
    import pyarrow as pa
    import pyarrow.parquet as pq

    for d in ("BytedTsinghua-SIA/DAPO-Math-17k", "yentinglin/aime_2025", "Maxwell-Jia/AIME_2024"):
        (tmp_path / "dataset" / d).mkdir(parents=True)
        pq.write_table(pa.table({"Problem": ["What is 2 + 3?"] * 8, "Answer": [5] * 8}),
                       tmp_path / "dataset" / d / "train.parquet")
    r = cli("import", "verl", CORPUS / "dapo_7b_async_retool.sh", "-o", "run.toml", "--hardware", "h20",
            "--row-adapter", "adapter.py:fn")
    assert r.exit_code == 0, r.output
    text = (tmp_path / "run.toml").read_text()
    written = tomllib.loads(text)
    assert written["rollout"]["multi_turn"] == {k.rsplit(".", 1)[-1]: v for k, v in RETOOL_MULTI_TURN.items()}
    assert (written["rollout"]["val_n"], written["rollout"]["val_temperature"]) == (30, 1.0)
    assert written["data"]["row_adapter"] == "adapter.py:fn"
    assert "replacing verl's data.custom_cls CustomRLHFDataset (recipe/retool/retool.py)" in text
    # the adapter is run on the first rows of every file by validate: a broken one is caught there
    (tmp_path / "adapter.py").write_text("def fn(row):\n    return {'prompt': row['Problem']}\n")
    r = cli("import", "verl", CORPUS / "dapo_7b_async_retool.sh", "-o", "run.toml", "--hardware", "h20",
            "--row-adapter", "adapter.py:fn", "--force")
    assert r.exit_code == 1 and "data.row_adapter" in r.output
