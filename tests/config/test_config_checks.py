"""Cross-field rules, resource fit, memory fit and pitfalls, each located at file:line and key."""

from __future__ import annotations

from pathlib import Path

from asyncrl_cli.config.loader import analyze_run_config
from asyncrl_cli.config.problems import EXIT_DOES_NOT_FIT, EXIT_INVALID, EXIT_OK

RUNS = Path(__file__).resolve().parents[2] / "presets" / "runs"
VL16 = RUNS / "qwen3-vl-8b-geo3k-fsdp2-npu-16-16.toml"
MOE = RUNS / "qwen3-30b-a3b-base-dapo-megatron-96-32.toml"


def by_code(an, code: str):
    found = [p for p in an.problems if p.code == code]
    assert found, [p.render() for p in an.problems]
    return found[0]


def test_16_per_node_on_8_per_node_hardware_exits_3_naming_gpus_per_node() -> None:
    an = analyze_run_config(VL16, ["resources.hardware=ascend-910b"])
    assert an.exit_code == EXIT_DOES_NOT_FIT
    errs = [p for p in an.problems if p.severity == "error"]
    assert {p.key for p in errs} == {"resources.trainer.gpus_per_node", "resources.rollout.gpus_per_node"}
    p = errs[0]
    assert p.file.endswith("qwen3-vl-8b-geo3k-fsdp2-npu-16-16.toml") and p.line is not None
    assert "nnodes = 2, gpus_per_node = 8" in (p.hint or "")


def test_is_weights_unused_in_bypass_ppo_clip_is_a_warning_at_its_line() -> None:
    an = analyze_run_config(VL16)
    assert an.exit_code == EXIT_OK
    p = by_code(an, "is-weights-unused")
    assert p.severity == "warning" and p.key == "algorithm.rollout_correction.rollout_is"
    line = next(i for i, text in enumerate(VL16.read_text().splitlines(), 1) if text.startswith("rollout_is ="))
    assert p.file.endswith("16-16.toml") and p.line == line
    an2 = analyze_run_config(VL16, ["algorithm.rollout_correction.bypass_mode=false"])
    assert "is-weights-unused" not in [q.code for q in an2.problems]


def test_qwen3_30b_a3b_non_base_pitfall() -> None:
    an = analyze_run_config(MOE, ["model.path=Qwen/Qwen3-30B-A3B"])
    p = by_code(an, "pitfall-qwen3-30b-a3b")
    assert p.severity == "warning" and "-Base" in p.message
    assert "pitfall-qwen3-30b-a3b" not in [q.code for q in analyze_run_config(MOE).problems]


def test_npu_note_and_missing_data_names_the_env_var() -> None:
    an = analyze_run_config(VL16)
    assert by_code(an, "npu-untested").severity == "info"
    p = [q for q in an.problems if q.code == "path-not-found" and q.key == "data.train_files"][0]
    assert "GEO3K_TRAIN" in (p.hint or "")
    assert p.file.endswith("presets/datasets/geo3k.toml") and p.line == 5


def test_env_var_redirects_data_paths(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "train.parquet").write_bytes(b"")
    monkeypatch.setenv("GEO3K_TRAIN", str(tmp_path / "train.parquet"))
    an = analyze_run_config(VL16)
    assert not [q for q in an.problems if q.code == "path-not-found" and q.key == "data.train_files"]


def test_parallel_layout_and_batch_divisibility(write, minimal) -> None:
    an = analyze_run_config(MOE, ["trainer.pp=3", "trainer.use_dynamic_bsz=false"])
    assert an.exit_code == EXIT_DOES_NOT_FIT
    assert by_code(an, "megatron-layout").key == "trainer.tp"
    an = analyze_run_config(MOE, ["trainer.ppo_micro_batch_size_per_gpu=3", "trainer.use_dynamic_bsz=false"])
    assert an.exit_code == EXIT_INVALID
    assert by_code(an, "batch-micro").key == "trainer.ppo_micro_batch_size_per_gpu"
    an = analyze_run_config(MOE, ["rollout.tensor_parallel_size=16"])
    assert by_code(an, "rollout-tp-node").category == "fit"


def test_megatron_on_many_trainer_ranks_validates_with_its_cp_and_pp() -> None:
    an = analyze_run_config(MOE)
    assert an.exit_code == EXIT_OK  # the seed's 32-rank Megatron layout (cp = 2) validates and dry-runs
    assert not [p for p in an.problems if p.code.startswith("megatron") and p.severity != "info"]
    piped = analyze_run_config(MOE, ["trainer.cp=1", "trainer.pp=2", "trainer.use_dynamic_bsz=false",
                                     "trainer.recompute_granularity=\"full\""])
    assert piped.exit_code == EXIT_OK and not [p for p in piped.problems if p.code.startswith("megatron")]


def test_context_parallelism_on_a_cpu_preset_is_refused_with_the_reason() -> None:
    an = analyze_run_config(RUNS / "seed000-mini-cpu.toml", ["trainer.ep=1", "trainer.cp=2"])
    p = by_code(an, "megatron-cp-cpu")
    assert an.exit_code != EXIT_OK and p.severity == "error" and p.key == "trainer.cp"
    assert "Transformer Engine needs CUDA" in p.message


def test_bad_megatron_layouts_are_refused_with_the_key_and_the_reason() -> None:
    cases = {  # --set → (code, key, words of the reason)
        "trainer.tp=8": ("tp-heads", "trainer.tp", "4 KV heads"),  # 32 heads split, 4 KV heads do not
        "trainer.ep=7": ("ep-experts", "trainer.ep", "128 experts"),
        "trainer.etp=8": ("megatron-ep", "trainer.ep", "etp × ep = 8×8 = 64 does not divide tp × cp × dp = 32"),
        "rollout.tensor_parallel_size=16": ("rollout-tp-node", "rollout.tensor_parallel_size", "stays inside a node"),
        "trainer.pp=3": ("megatron-layout", "trainer.tp", "does not divide the 32 trainer GPUs"),
    }
    for setting, (code, key, reason) in cases.items():
        an = analyze_run_config(MOE, [setting])
        assert an.exit_code != EXIT_OK, setting
        p = by_code(an, code)
        assert p.severity == "error" and p.key == key and reason in p.message, (setting, p.render())
    # Megatron's rule with etp = 1 (verl's default): ep = 32 divides tp × cp × dp = 32 though not dp × cp = 16
    assert analyze_run_config(MOE, ["trainer.ep=32"]).exit_code == EXIT_OK
    assert analyze_run_config(MOE, ["trainer.ep=32", "trainer.etp=2"]).exit_code != EXIT_OK
    an = analyze_run_config(MOE, ["resources.trainer.gpus_per_node=6", "trainer.tp=4", "trainer.cp=1",
                                  "trainer.ep=1", "trainer.ppo_mini_batch_size=96"])
    p = by_code(analyze_run_config(MOE, ["trainer.tp=1", "trainer.cp=1", "trainer.ep=1", "trainer.pp=32"]), "pp-layers")
    assert p.severity == "error" and p.key == "trainer.pp" and "48 layers" in p.message
    p = by_code(an, "tp-across-nodes")
    assert p.severity == "error" and p.key == "trainer.tp" and "span nodes" in p.message


def test_torch_backend_rejects_model_parallel_and_grpo_needs_groups(write, minimal) -> None:
    run = write("run.toml", minimal + "[trainer]\ntp = 2\n[rollout]\nn = 1\n")
    an = analyze_run_config(run)
    assert an.exit_code == EXIT_INVALID
    assert by_code(an, "torch-parallel").line == 7
    assert by_code(an, "grpo-group-size").key == "rollout.n"


def test_settings_that_do_nothing_warn(write, minimal) -> None:
    run = write(
        "run.toml",
        minimal + '[trainer]\nkl_loss_coef = 0.1\n[async_training]\nmode = "sync"\n'
        'staleness_threshold = 0.3\nstale_policy = "wait"\n[algorithm.rollout_correction]\n'
        'rollout_rs_threshold = "0.9_1.1"\n',
    )
    codes = {p.code for p in analyze_run_config(run).problems if p.severity == "warning"}
    assert {"kl-noop", "sync-staleness", "stale-policy-noop", "rs-threshold-noop"} <= codes


def test_an_attention_kernel_on_the_megatron_backend_warns_that_it_does_nothing() -> None:
    """Megatron runs megatron-core's attention: `trainer.attn_implementation` set there is said to do nothing
    (and not said when it is left at its default)."""
    an = analyze_run_config(MOE, ['trainer.attn_implementation="eager"'])
    p = by_code(an, "attn-implementation-ignored")
    assert p.severity == "warning" and p.key == "trainer.attn_implementation" and "megatron" in p.message
    assert "attn-implementation-ignored" not in {q.code for q in analyze_run_config(MOE).problems}


def test_rs_without_threshold_is_an_error(write, minimal) -> None:
    run = write("run.toml", minimal + '[algorithm.rollout_correction]\nrollout_rs = "seq_mean_k3"\n')
    an = analyze_run_config(run)
    assert by_code(an, "rs-threshold-missing").severity == "error"


def test_memory_does_not_fit_exits_3_with_numbers() -> None:
    an = analyze_run_config(
        MOE,
        [
            "resources.trainer.nnodes=1",
            "resources.trainer.gpus_per_node=8",
            "trainer.tp=1",
            "trainer.cp=1",
            "trainer.ep=4",  # 8 ranks with ep 8 fit (~96 GB) since recompute, token budgets and the offloaded ref
        ],
    )
    assert an.exit_code == EXIT_DOES_NOT_FIT
    p = by_code(an, "trainer-memory")
    assert "GB per GPU" in p.message and "h20" in p.message
    assert an.fit is not None and not an.fit.trainer.fits


def test_rollout_weights_that_do_not_fit(write, minimal) -> None:
    an = analyze_run_config(MOE, ["rollout.tensor_parallel_size=1", "resources.hardware=h100"])
    p = by_code(an, "rollout-weights")
    assert p.category == "fit" and an.exit_code == EXIT_DOES_NOT_FIT


def test_unknown_keys_get_suggestions_and_lines(write, minimal) -> None:
    run = write("run.toml", minimal + "[trainer]\nlr = 1e-5\nppo_mini_batch_sise = 4\n[optim]\nlr = 1\n")
    an = analyze_run_config(run)
    assert an.exit_code == EXIT_INVALID
    hints = {p.key: (p.hint, p.line) for p in an.problems}
    assert hints["trainer.lr"] == ("did you mean 'trainer.optim.lr'?", 7)
    assert hints["trainer.ppo_mini_batch_sise"][0] == "did you mean 'trainer.ppo_mini_batch_size'?"
    assert hints["optim"][0] == "did you mean 'trainer.optim'?"


def test_wrong_types_and_negative_sizes(write, minimal) -> None:
    run = write("run.toml", minimal + 'max_response_length = -5\n[trainer]\nppo_epochs = "two"\n')
    an = analyze_run_config(run)
    got = {p.key: p for p in an.problems}
    assert "greater than 0" in got["data.max_response_length"].message
    assert got["data.max_response_length"].line == 6
    assert got["trainer.ppo_epochs"].line == 8


def test_unknown_hardware_is_invalid_with_suggestion(write, minimal) -> None:
    run = write("run.toml", minimal + '[resources]\nhardware = "h10"\n')
    p = by_code(analyze_run_config(run), "hardware-unknown")
    assert "h100" in p.message and p.line == 7


def test_several_trainer_ranks_on_cpu_are_accepted_with_a_warning() -> None:
    tiny = RUNS / "tiny-cpu.toml"
    an = analyze_run_config(tiny, ["resources.trainer.gpus_per_node=2"])
    assert an.exit_code == EXIT_OK
    p = by_code(an, "cpu-trainer-ranks")
    assert p.severity == "warning" and p.key == "resources.trainer.gpus_per_node" and "share" in p.message
    assert "cpu-trainer-ranks" not in [q.code for q in analyze_run_config(tiny).problems]


def test_bf16_rollout_against_fp32_trainer_without_correction_is_noted() -> None:
    tiny = RUNS / "tiny-cpu.toml"
    an = analyze_run_config(tiny, ["rollout.dtype=bf16"])
    assert an.exit_code == EXIT_OK
    p = by_code(an, "precision-mismatch-uncorrected")
    assert p.severity == "info" and p.key == "rollout.dtype"
    corrected = analyze_run_config(tiny, ["rollout.dtype=bf16",
                                          "algorithm.rollout_correction.preset=decoupled_geo_rs_seq_tis"])
    assert "precision-mismatch-uncorrected" not in [q.code for q in corrected.problems]
    assert "precision-mismatch-uncorrected" not in [q.code for q in analyze_run_config(tiny).problems]
    bad = analyze_run_config(tiny, ["rollout.dtype=fp16"])
    assert bad.exit_code == EXIT_INVALID and any(q.key == "rollout.dtype" for q in bad.problems)


def test_trainer_bf16_compute_validates_on_both_backends_and_a_pure_bf16_optimizer_is_warned() -> None:
    tiny = RUNS / "tiny-cpu.toml"
    both = analyze_run_config(tiny, ["rollout.dtype=bf16", "trainer.precision=bf16"])
    assert both.exit_code == EXIT_OK  # bf16 on both sides: no precision mismatch to note
    assert "precision-mismatch-uncorrected" not in [q.code for q in both.problems]
    mega = analyze_run_config(RUNS / "seed000-mini-cpu.toml", ["trainer.precision=bf16"])
    assert mega.exit_code == EXIT_OK  # Megatron: bf16 params with fp32 main params in the optimizer
    assert "no-fp32-master-weights" not in [q.code for q in both.problems]
    pure = analyze_run_config(tiny, ['model.dtype="bfloat16"', "trainer.fp32_master_weights=false"])
    p = by_code(pure, "no-fp32-master-weights")
    assert p.severity == "warning" and p.key == "trainer.fp32_master_weights" and "never move" in p.message
    fp32 = analyze_run_config(tiny, ["trainer.fp32_master_weights=false"])  # fp32 compute: fp32 anyway
    assert "no-fp32-master-weights" not in [q.code for q in fp32.problems]
    det = analyze_run_config(tiny, ["trainer.deterministic=true", "trainer.precision=bf16"])
    assert det.exit_code == EXIT_INVALID and any(q.key == "trainer.precision" for q in det.problems)


def test_dynamic_bsz_on_megatron_pipelines_warns_under_the_allgather_dispatcher_and_a_short_budget_is_refused() -> None:
    an = analyze_run_config(MOE, ["trainer.use_dynamic_bsz=true", "trainer.pp=2"])
    p = by_code(an, "dynamic-bsz-megatron-pp-allgather")
    assert p.severity == "warning" and p.key == "trainer.use_dynamic_bsz"
    assert "dynamic-bsz-megatron-pp-allgather" not in [q.code for q in analyze_run_config(
        MOE, ["trainer.use_dynamic_bsz=true", "trainer.pp=2", 'trainer.moe_token_dispatcher_type="alltoall"']).problems]
    an = analyze_run_config(VL16, ["trainer.use_dynamic_bsz=true", "trainer.log_prob_max_token_len_per_gpu=100"])
    p = by_code(an, "token-budget-row")
    assert p.key == "trainer.log_prob_max_token_len_per_gpu" and "at least" in p.message
    assert an.exit_code == EXIT_INVALID


def test_validate_warns_when_the_checkpoint_disk_is_smaller_than_keep_last_plus_one_checkpoints(tmp_path) -> None:
    """(keep_last + 1) × one checkpoint (torch: weights + AdamW m, v in fp32 = 12 bytes per parameter) against the
    free space of the checkpoint directory's filesystem; a real small tmpfs where mounting is allowed."""
    import shutil
    import subprocess

    smol = RUNS / "smollm2-arith-cpu.toml"
    an = analyze_run_config(smol, [f'checkpoint.dir="{tmp_path / "ckpt"}"', "checkpoint.keep_last=2"])
    need = 3 * 12 * an.model.params_total
    found = [p for p in an.problems if p.code == "checkpoint-disk"]
    assert bool(found) == (shutil.disk_usage(tmp_path).free < need)
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(disk)], capture_output=True).returncode:
        return  # not root: the comparison above is the test
    try:
        an = analyze_run_config(smol, [f'checkpoint.dir="{disk / "ckpt"}"', "checkpoint.keep_last=2"])
        p = by_code(an, "checkpoint-disk")
        assert p.severity == "warning" and p.key == "checkpoint.dir" and an.exit_code == EXIT_OK
        assert f"(keep_last + 1) × {12 * an.model.params_total / 1e9:.3g} GB" in p.message and str(disk) in p.message
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_sequence_loss_modes_are_checked_with_one_line_each() -> None:
    """gspo/geo_mean: any loss_agg_mode without KL or entropy, seq-mean-token-mean with them, never REINFORCE."""
    tiny = RUNS / "tiny-cpu-sync.toml"
    assert analyze_run_config(tiny, ['trainer.loss_mode="gspo"']).exit_code == EXIT_OK
    ok = analyze_run_config(tiny, ['trainer.loss_mode="geo_mean"', "trainer.use_kl_loss=true",
                                   'trainer.loss_agg_mode="seq-mean-token-mean"'])
    assert ok.exit_code == EXIT_OK
    for sets, words in (
        (['trainer.loss_mode="sapo"'], "'vanilla', 'gspo' or 'geo_mean'"),
        (['trainer.loss_mode="gspo"', "trainer.entropy_coeff=0.01"], "needs loss_agg_mode = 'seq-mean-token-mean'"),
        (['trainer.loss_mode="geo_mean"', 'algorithm.rollout_correction.loss_type="reinforce"'], "loss_type"),
    ):
        an = analyze_run_config(tiny, sets)
        errs = [p for p in an.problems if p.severity == "error"]
        assert an.exit_code == EXIT_INVALID and len(errs) == 1, [p.render() for p in an.problems]
        assert words in errs[0].message and "\n" not in errs[0].message


def test_ulysses_size_is_checked_against_ranks_heads_and_backend() -> None:
    sp = "trainer.ulysses_sequence_parallel_size"
    for ok in (4, 16):  # 16 ranks; Qwen3-VL-8B: 32 heads, 8 KV heads (16 > 8: each KV head repeated twice)
        assert analyze_run_config(VL16, [f"{sp}={ok}"]).exit_code == EXIT_OK, ok
    an = analyze_run_config(VL16, [f"{sp}=3"])
    assert by_code(an, "ulysses-world").message == f"{sp.split('.')[1]} = 3 must divide the trainer's 16 ranks"
    assert "32 attention heads" in by_code(an, "ulysses-heads").message
    assert "batch-dp" not in [p.code for p in an.problems]  # one reason per cause, not its consequences
    an = analyze_run_config(VL16, [f"{sp}=4", "trainer.use_dynamic_bsz=true"])
    longest = an.config.data.max_prompt_length + an.config.data.max_response_length
    fits = -(-longest // 4)  # an SP group's budget is 4 × the per-GPU budget (verl's count)
    assert analyze_run_config(VL16, [f"{sp}=4", "trainer.use_dynamic_bsz=true",
                                     f"trainer.ppo_max_token_len_per_gpu={fits}"]).exit_code == EXIT_OK
    low = analyze_run_config(VL16, [f"{sp}=4", "trainer.use_dynamic_bsz=true",
                                    f"trainer.ppo_max_token_len_per_gpu={fits - 1}"])
    assert "× ulysses 4 is below the longest row" in by_code(low, "token-budget-row").message
    an = analyze_run_config(MOE, [f"{sp}=2"])
    assert an.exit_code == EXIT_INVALID and "trainer.cp" in by_code(an, "ulysses-megatron").message
