"""`asyncrl import verl`: named override blocks, arrays, positional defaults, resource variables, legacy keys,
and the contract — every override mapped, ignored with its reason, or an error that stops the conversion."""

from __future__ import annotations

import tomllib
from pathlib import Path

from asyncrl_cli.verl_import.convert import convert_script
from asyncrl_cli.verl_import.shell import parse_script

FIXTURES = Path(__file__).parent / "fixtures"
GEO3K = FIXTURES / "verl_geo3k_qwen3vl_8b_fsdp2_16_16_npu.sh"
LEGACY = FIXTURES / "verl_grpo_30b_a3b_base_megatron_96_32_mis_legacy.sh"


def test_shell_reader_expands_blocks_defaults_and_arithmetic() -> None:
    sc = parse_script(LEGACY.read_text())
    assert sc.variables["max_response_length"] == "8192"
    assert (
        sc.variables["MODEL_PATH"]
        == "${MODEL_PATH:-${RAY_DATA_HOME:-${HOME}/verl}/models/Qwen3-30B-A3B-Base}"
    )
    assert "NNODES_TRAIN" in sc.env_defaults
    geo = parse_script(GEO3K.read_text())
    (cmd,) = [c for c in geo.commands if "verl.experimental.fully_async_policy.fully_async_main" in c]
    assert "data.image_key=images" in cmd and "async_training.require_batches=2" in cmd  # $BLOCKS were split


def test_geo3k_script_maps_every_block(cli, tmp_path: Path) -> None:
    r = cli("import", "verl", GEO3K, "-o", "geo3k.toml")
    assert r.exit_code == 0, r.output
    data = tomllib.loads((tmp_path / "geo3k.toml").read_text())
    assert data["resources"]["hardware"] == "ascend-910c"  # 16 NPUs per node → 910C, as guessed
    assert data["resources"]["trainer"] == {"nnodes": 1, "gpus_per_node": 16}
    assert data["data"]["train_files"] == ["${train_path:-${HOME}/data/geo3k/train.parquet}"]
    assert data["data"]["image_key"] == "images" and data["data"]["shuffle"] is False
    assert data["trainer"]["backend"] == "torch" and data["trainer"]["kl_loss_coef"] == 0.01
    assert data["rollout"]["n"] == 4 and data["rollout"]["total_rollout_steps"] == 51200
    assert data["async_training"] == {
        "staleness_threshold": 0.1,
        "trigger_parameter_sync_step": 4,
        "require_batches": 2,
        "partial_rollout": True,
    }
    rc = data["algorithm"]["rollout_correction"]
    assert rc["rollout_rs"] == "token_k1" and rc["rollout_rs_threshold"] == "0.6_1.6"
    assert data["logging"]["sinks"] == ["jsonl", "console", "wandb"]
    # overrides with no effect on the experiment are listed in the file with their reason; none is an error
    text = (tmp_path / "geo3k.toml").read_text()
    for ignored in ("data.truncation='error'", "actor_rollout_ref.rollout.max_model_len=32768",
                    "actor_rollout_ref.rollout.engine_kwargs.vllm.mm_processor_cache_gb=0",
                    "data.train_batch_size=0"):
        assert ignored in text
    assert data["trainer"]["use_dynamic_bsz"] is True  # a token budget is mapped, not dropped
    assert "not converted" not in r.output


def test_geo3k_import_on_8_per_node_hardware_exits_3(cli) -> None:
    r = cli("import", "verl", GEO3K, "-o", "geo3k.toml", "--hardware", "ascend-910b")
    assert r.exit_code == 3
    assert "resources.trainer.gpus_per_node" in r.stdout


def test_legacy_keys_are_converted_and_a_removed_veto_refuses(cli, tmp_path: Path) -> None:
    conv = convert_script(LEGACY.read_text())
    rc = {k.rpartition(".")[2]: v for k, v in conv.values.items() if k.startswith("algorithm.rollout_correction.")}
    # legacy geometric bounded geo(π_train/π_rollout) to [0.999, 1.001]; seq_mean_k1 bounds the inverse ratio
    assert rc == {"rollout_rs": "seq_mean_k1", "rollout_rs_threshold": "0.999000999001_1.001001001",
                  "bypass_mode": False}
    assert conv.values["trainer.backend"] == "megatron"  # from --config-name=…megatron…
    assert (conv.values["trainer.tp"], conv.values["trainer.cp"], conv.values["trainer.ep"]) == (2, 2, 8)
    assert conv.values["resources.rollout.nnodes"] == 12 and conv.values["rollout.top_k"] == 0
    r = cli("import", "verl", LEGACY, "-o", "moe.toml", "--hardware", "h20")
    assert r.exit_code == 1 and not (tmp_path / "moe.toml").exists()  # the veto changed verl's experiment
    assert "rollout_token_veto_threshold=1e-4" in r.stderr and "removed in verl" in r.stderr
    assert "algorithm.adv_estimator (unset)" in r.stderr  # verl's default is gae, not asyncrl's grpo
    assert "geometric" in r.stdout  # the conversion is announced


def test_arrays_positional_defaults_and_unknown_base_configs() -> None:
    """`"${arr[@]}"` expands to its overrides (each accounted for), `${1:-x}` takes its default with a note, a bare
    `$2` and an unknown `--config-name` are errors — never dropped."""
    conv = convert_script(
        "mtp_params=(\n  actor_rollout_ref.model.mtp.enable=True  # MTP\n"
        "  actor_rollout_ref.model.mtp.enable_train=True\n)\nMAXLEN=${1:-4096}\n"
        "python -m verl.experimental.fully_async_policy.fully_async_main --config-name=my_base.yaml "
        'algorithm.adv_estimator=grpo "${mtp_params[@]}" data.max_response_length=$MAXLEN data.seed=$2\n')
    assert conv.values["data.max_response_length"] == 4096
    assert any("$1" in n and "4096" in n for n in conv.notes)
    errors = {ov.partition("=")[0] for ov, _ in conv.errors}
    assert {"actor_rollout_ref.model.mtp.enable", "--config-name", "$2: a positional parameter without a default"} \
        <= errors
    assert "actor_rollout_ref.model.mtp.enable=True actor_rollout_ref.model.mtp.enable_train=True" in {
        ov for ov, _ in conv.errors}  # the array's MTP keys: one refusal line


def test_values_asyncrl_cannot_honour_are_errors_and_verl_defaults_are_filled() -> None:
    conv = convert_script(_script("algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.name=sglang",
                                  "actor_rollout_ref.actor.ppo_mini_batch_size=16", "trainer.some_new_key=1",
                                  "actor_rollout_ref.model.path=Qwen/Qwen2.5-VL-7B-Instruct"))
    errors = dict((ov.partition("=")[0], why) for ov, why in conv.errors)
    assert "sglang" in errors["actor_rollout_ref.rollout.name"] and "trainer.some_new_key" in errors
    assert "rollout.backend" not in conv.sources or "sglang" not in conv.sources["rollout.backend"]
    assert conv.values["data.image_key"] == "images"  # verl's default, for a vision-language model
    assert conv.values["rollout.n"] == 4 and conv.values["data.filter_overlong_prompts"] is False


def test_resource_variables_are_a_fallback() -> None:
    conv = convert_script(
        "n_gpus_rollout=4\nn_gpus_training=12\nn_nodes_rollout=1\nn_nodes_train=1\n"
        "python3 -m verl.experimental.fully_async_policy.fully_async_main data.max_prompt_length=64\n"
    )
    assert conv.values["resources.rollout.gpus_per_node"] == 4
    assert conv.values["resources.trainer.gpus_per_node"] == 12
    assert conv.values["data.max_prompt_length"] == 64


def test_import_usage_errors(cli, tmp_path: Path) -> None:
    assert cli("import", "verl", "nope.sh", "-o", "x.toml").exit_code == 2
    (tmp_path / "x.toml").write_text("")
    assert cli("import", "verl", GEO3K, "-o", "x.toml").exit_code == 2
    assert cli("import", "verl", GEO3K, "-o", "y.toml", "--hardware", "tpu").exit_code == 2


def _script(*lines: str) -> str:
    """A verl fully-async launch line with `lines` as overrides (as in verl's shell/ scripts)."""
    body = " \\\n    ".join(lines)
    return f"python -m verl.experimental.fully_async_policy.fully_async_main \\\n    {body}\n"


def test_legacy_bands_are_inverted_so_the_same_rows_survive() -> None:
    """The legacy lines of verl's `grpo_30b_a3b_base_math_megatron_96_32_mis.sh` (PR #4023 era), asymmetric bounds."""
    import torch

    from engine.algo.rollout_correction import compute_rollout_correction

    conv = convert_script(_script("algorithm.rollout_correction.rollout_rs=geometric",
                                  "algorithm.rollout_correction.rollout_rs_threshold=1.6",
                                  "algorithm.rollout_correction.rollout_rs_threshold_lower=0.9"))
    assert conv.values["algorithm.rollout_correction.rollout_rs"] == "seq_mean_k1"
    spec = conv.values["algorithm.rollout_correction.rollout_rs_threshold"]
    assert spec == "0.625_1.11111111111"
    # rows whose geometric-mean π_train/π_rollout is 0.8, 0.95, 1.5, 1.7: legacy kept 0.95 and 1.5 only
    geo = torch.tensor([0.8, 0.95, 1.5, 1.7])
    train = torch.log(geo)[:, None].expand(4, 3).contiguous()
    _, mask, _ = compute_rollout_correction(train, torch.zeros(4, 3), torch.ones(4, 3), rollout_rs="seq_mean_k1",
                                            rollout_rs_threshold=spec)
    assert mask[:, 0].tolist() == [0.0, 1.0, 1.0, 0.0]


def test_legacy_token_mode_is_inverted_too_and_an_upper_bound_alone_is_kept() -> None:
    conv = convert_script(_script("algorithm.rollout_correction.rollout_rs=token",
                                  "algorithm.rollout_correction.rollout_rs_threshold=2.0",
                                  "algorithm.rollout_correction.rollout_rs_threshold_lower=0.25"))
    assert conv.values["algorithm.rollout_correction.rollout_rs"] == "token_k1"
    assert conv.values["algorithm.rollout_correction.rollout_rs_threshold"] == "0.5_4"
    conv = convert_script(_script("algorithm.rollout_correction.rollout_rs=geometric",
                                  "algorithm.rollout_correction.rollout_rs_threshold=1.001"))
    assert conv.values["algorithm.rollout_correction.rollout_rs_threshold"] == 1.001  # [1/u, u] is symmetric


def test_a_custom_reward_function_maps_to_the_reward_path() -> None:
    from engine.config.sections import DataConfig

    conv = convert_script(_script("algorithm.adv_estimator=grpo", "reward.custom_reward_function.path=recipe/my/score.py",
                                  "reward.custom_reward_function.name=compute_score"))
    assert conv.values["data.reward"] == "recipe/my/score.py:compute_score" and not conv.errors
    assert DataConfig(train_files=["x.parquet"], reward=conv.values["data.reward"]).reward.endswith(":compute_score")


def test_import_help_names_the_exit_codes(cli) -> None:
    out = " ".join(cli("import", "verl", "--help").stdout.split())
    assert "Exit codes: 0 written and valid" in out and "3 written, but it does not fit" in out


def test_standalone_gpu_memory_utilization_is_the_one_asyncrls_replicas_use() -> None:
    """verl: standalone rollout replicas use standalone_gpu_memory_utilization (gpu_memory_utilization is for
    replicas that share devices with the trainer); asyncrl's replicas are always standalone."""
    conv = convert_script(_script("algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.gpu_memory_utilization=0.35",
                                  "+actor_rollout_ref.rollout.standalone_gpu_memory_utilization=0.8"))
    assert conv.values["rollout.gpu_memory_utilization"] == 0.8 and not conv.errors
    assert any(ov.startswith("actor_rollout_ref.rollout.gpu_memory_utilization") for ov, _ in conv.ignored)


def test_the_attention_kernel_is_imported_and_flash_attention_runs_as_sdpa() -> None:
    key = "actor_rollout_ref.model.override_config.attn_implementation"
    assert convert_script(_script(f"+{key}=eager")).values["trainer.attn_implementation"] == "eager"
    assert convert_script(_script(f"+{key}=flash_attention_2")).values["trainer.attn_implementation"] == "sdpa"
    errors = dict((ov.partition("=")[0], why) for ov, why in convert_script(_script(f"+{key}=flex")).errors)
    assert "'flex' is not in asyncrl" in errors[key]


def test_dapo_dynamic_sampling_is_imported() -> None:
    """DAPO's `algorithm.filter_groups` lines: enable and metric map, the generation cap is listed as ignored."""
    conv = convert_script(_script("algorithm.adv_estimator=grpo", "algorithm.filter_groups.enable=True",
                                  "algorithm.filter_groups.metric=acc",
                                  "algorithm.filter_groups.max_num_gen_batches=10"))
    assert conv.values["algorithm.filter_groups.enable"] is True and not conv.errors
    assert conv.values["algorithm.filter_groups.metric"] == "acc"
    assert any(ov.startswith("algorithm.filter_groups.max_num_gen_batches") for ov, _ in conv.ignored)


def test_every_mapped_key_has_a_table_in_the_written_file() -> None:
    """A key the importer maps into a section the writer does not know would crash `asyncrl import verl`."""
    from asyncrl_cli.verl_import.convert import MAP
    from asyncrl_cli.verl_import.write import ORDER

    sections = {target.rpartition(".")[0] for target, _ in MAP.values()}
    assert sections <= set(ORDER), sorted(sections - set(ORDER))


def test_remove_padding_is_imported() -> None:
    """verl's `model.use_remove_padding` is asyncrl's `trainer.use_remove_padding` (packed rows), either way."""
    key = "actor_rollout_ref.model.use_remove_padding"
    for value, want in (("True", True), ("False", False)):
        conv = convert_script(_script("algorithm.adv_estimator=grpo", f"{key}={value}"))
        assert conv.values["trainer.use_remove_padding"] is want and not conv.errors
        assert not any(ov.startswith(key) for ov, _ in conv.ignored)
