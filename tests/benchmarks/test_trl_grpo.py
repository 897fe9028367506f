"""The TRL side-by-side study without TRL: its reward adapter scores exactly as asyncrl's Scorer, and its
recipe is the demo preset's (n, prompts per step, max tokens, lr, ...), so the comparison runs the same work."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.common import PRESETS
from benchmarks.engine_runs import load_config
from benchmarks.trl_grpo import PRESET, SIZES, summarize_trl
from benchmarks.trl_spec import SpecError, first_time_at, make_reward_adapter, recipe_from_config, validation_steps
from engine.config.sections import DataConfig
from engine.models.tiny import build_tiny_tokenizer
from engine.runtime.scoring import Scorer
from engine.plan.role_parts import scoring_spec
from engine.types import Prompt

ARITH_CASES = [
    ("Tom has 7 + 5 = 12 apples.\n#### 12", "12", True),
    ("Tom has 7 - 5 = 2 apples.\n#### 2", "12", True),  # the format, the wrong number
    ("Tom has 7 + 5 = 12 apples.", "12", True),  # no `####`
    ("Anna has 9 + 4 = 13 books.\n#### 13", "13", False),  # cut at the token budget
    ("#### 1,3", "13", True),  # commas dropped, as in gsm8k answers
]
COPY_CASES = [("381", "381", True), ("381", "381", False), ("38", "381", True), ("183", "381", True)]


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer(("copy", "reverse", "arith"))


def _both(tokenizer, reward: str, cases, split: str) -> tuple[list[float], list[float]]:
    """(asyncrl Scorer scores, TRL adapter scores) of the same responses, token ids and rows."""
    scorer = Scorer(scoring_spec(DataConfig(train_files=["x.parquet"], reward=reward)), tokenizer)
    adapter = make_reward_adapter(reward, [tokenizer.eos_token_id])
    source = f"asyncrl/{reward}"
    mine, theirs, ids_all = [], [], []
    for i, (text, truth, finished) in enumerate(cases):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"] + ([tokenizer.eos_token_id] if finished else [])
        prompt = Prompt(uid=f"0:{i}", index=i, epoch=0, prompt_ids=[1], ground_truth=truth, data_source=source,
                        extra_info={"split": split, "index": i})
        mine.append(scorer._score(prompt, ids, finished)[0])
        ids_all.append(ids)
    completions = [[{"role": "assistant", "content": tokenizer.decode(ids, skip_special_tokens=True)}]
                   for ids in ids_all]
    theirs = adapter(prompts=[None] * len(cases), completions=completions, completion_ids=ids_all,
                     ground_truth=[c[1] for c in cases], data_source=[source] * len(cases),
                     split=[split] * len(cases), index=list(range(len(cases))))
    assert adapter.generated_tokens == sum(len(x) for x in ids_all)
    return mine, theirs


@pytest.mark.parametrize("split", ["train", "val"])
def test_trl_reward_adapter_scores_as_the_project_scorer(tokenizer, split: str) -> None:
    mine, theirs = _both(tokenizer, "arith", ARITH_CASES, split)
    assert theirs == mine
    bonus = 0.1 if split == "train" else 0.0  # the format bonus is paid on training rows only
    assert mine == pytest.approx([1.0 + bonus, bonus, 0.0, 1.0 + bonus, 1.0 + bonus])


def test_trl_reward_adapter_reads_eos_from_the_completion_ids(tokenizer) -> None:
    mine, theirs = _both(tokenizer, "copy", COPY_CASES, "train")
    assert theirs == mine
    assert mine[0] == 1.0 and mine[1] == 0.5  # the same digits, with and without EOS


def test_study_recipe_is_the_demo_preset() -> None:
    assert SIZES["full"]["overrides"] == []  # the full study runs the demo preset unchanged
    cfg = load_config(PRESETS / PRESET, [])
    r = recipe_from_config(cfg)
    prompts = cfg.trainer.ppo_mini_batch_size * cfg.async_training.require_batches
    assert r["num_generations"] == cfg.rollout.n
    assert r["prompts_per_step"] == prompts
    assert r["per_device_train_batch_size"] * r["gradient_accumulation_steps"] == prompts * cfg.rollout.n
    versions = cfg.trainer.total_steps
    assert r["max_steps"] == (versions * cfg.async_training.trigger_parameter_sync_step if versions is not None
                              else cfg.rollout.total_rollout_steps // prompts)
    assert r["filter_groups"] == cfg.algorithm.filter_groups.enable
    assert r["max_completion_length"] == cfg.data.max_response_length
    assert r["learning_rate"] == cfg.trainer.optim.lr
    assert [r["adam_beta1"], r["adam_beta2"]] == list(cfg.trainer.optim.betas)
    assert r["weight_decay"] == cfg.trainer.optim.weight_decay
    assert r["max_grad_norm"] == cfg.trainer.grad_clip
    assert r["temperature"] == cfg.rollout.temperature and r["top_k"] == cfg.rollout.top_k
    assert r["reward"] == cfg.data.reward and r["val_max_samples"] == cfg.data.val_max_samples
    assert r["beta"] == 0.0 and r["loss_type"] == "dapo" and r["scale_rewards"] == "group"
    every = cfg.trainer.test_freq * cfg.async_training.trigger_parameter_sync_step  # local steps between validations
    assert validation_steps(r["max_steps"], r["test_freq"], r["val_before_train"]) == sorted(
        set(range(0, r["max_steps"] + 1, every)) | {r["max_steps"]})  # and at the end, as asyncrl


def test_the_sync_trigger_is_trls_steps_per_generation() -> None:
    """asyncrl pushes weights every T local steps; TRL generates T optimizer steps' sequences with one policy."""
    cfg = load_config(PRESETS / PRESET, [])
    assert cfg.async_training.trigger_parameter_sync_step == 2  # the demo's
    r = recipe_from_config(cfg)
    assert r["steps_per_generation"] == 2 * r["gradient_accumulation_steps"]
    # TRL's generation_batch_size = per_device_train_batch_size × steps_per_generation: two steps of P · n
    assert r["per_device_train_batch_size"] * r["steps_per_generation"] == 2 * r["prompts_per_step"] * cfg.rollout.n
    every_step = recipe_from_config(load_config(PRESETS / PRESET, ["async_training.trigger_parameter_sync_step=1"]))
    assert every_step["steps_per_generation"] == every_step["gradient_accumulation_steps"]  # TRL's default


def test_recipe_refuses_a_trigger_trl_cannot_map() -> None:
    with pytest.raises(SpecError, match="ppo_epochs"):
        recipe_from_config(load_config(PRESETS / PRESET, ["trainer.ppo_epochs=2"]))
    by_prompts = load_config(PRESETS / PRESET, ["async_training.trigger_parameter_sync_step=3",
                                                "rollout.total_rollout_steps=80"]).model_dump()
    by_prompts["trainer"]["total_steps"] = None  # 20 steps from the prompts: not a whole number of 3-step versions
    with pytest.raises(SpecError, match="generations of trigger_parameter_sync_step = 3"):
        recipe_from_config(by_prompts)
    dumped = load_config(PRESETS / PRESET, []).model_dump()
    dumped["async_training"]["require_batches"] = 2
    with pytest.raises(SpecError, match="require_batches"):
        recipe_from_config(dumped)


def test_recipe_refuses_work_trl_cannot_repeat() -> None:
    cfg = load_config(PRESETS / PRESET, ["rollout.total_rollout_steps=10"]).model_dump()
    cfg["trainer"]["total_steps"] = None  # steps from the prompts: asyncrl would train a last, partial step
    with pytest.raises(SpecError, match="whole number"):
        recipe_from_config(cfg)
    dumped = load_config(PRESETS / PRESET, []).model_dump()
    dumped["trainer"]["loss_agg_mode"] = "seq-mean-token-mean"
    with pytest.raises(SpecError, match="token-mean"):
        recipe_from_config(dumped)


def test_validation_steps_end_with_the_last_step() -> None:
    assert validation_steps(7, 3, True) == [0, 3, 6, 7]
    assert validation_steps(4, 0, False) == [4]


def test_trl_summary_rates_and_time_to_threshold() -> None:
    res = {
        "label": "trl-fp32",
        "steps": [{"step": 1, "step_s": 10.0, "gen_s": 4.0, "tokens": 600, "time_s": 30.0},
                  {"step": 2, "step_s": 30.0, "gen_s": 5.0, "tokens": 400, "time_s": 70.0}],
        "validation": [{"step": 0, "time_s": 20.0, "acc": 0.5}, {"step": 1, "time_s": 35.0, "acc": 0.8},
                       {"step": 2, "time_s": 75.0, "acc": 0.9}],
        "gen_tokens_per_s": 1000 / 9.0,
    }
    s = summarize_trl(res)
    assert s["median_step_s"] == 20.0
    assert s["tokens_per_s"] == pytest.approx(1000 / 50.0)  # from the first validation to the last step
    assert s["time_to_threshold_s"] == 35.0
    assert first_time_at(s["curve"], 0.95) is None


def test_a_trl_run_is_labelled_with_its_seed_whatever_the_worker_calls_it(monkeypatch, tmp_path) -> None:
    """The worker names its run by precision only ("trl-bf16"); the study's seed-by-seed comparison looks runs
    up as "trl-bf16 seed 2", so `run_trl` must label them (a study at equal terms once compared nothing)."""
    import benchmarks.trl_grpo as study

    worker_out = {"label": "trl-bf16", "steps": [{"step": 1, "step_s": 10.0, "tokens": 600, "time_s": 30.0}],
                  "validation": [{"step": 0, "time_s": 20.0, "acc": 0.5}, {"step": 1, "time_s": 35.0, "acc": 0.8}],
                  "gen_tokens_per_s": 100.0, "wall_s": 40.0}
    monkeypatch.setattr(study, "trl_python", lambda: Path("python"))
    monkeypatch.setattr(study, "run_json_subprocess", lambda argv, threads, timeout_s: dict(worker_out))
    run = study.run_trl(tmp_path / "spec.json", "bf16", 60.0, " seed 2")
    assert run["label"] == "trl-bf16 seed 2" and run["time_to_threshold_s"] == 35.0
    runs = [{**run, "seed": 2}, {"label": "asyncrl-async seed 2", "time_to_threshold_s": 17.5, "wall_s": 30.0,
                                 "auto": {"trainer.precision": "bf16"}}]
    assert study.seed_ratios(runs, ["bf16"], [2])["ratios"] == {"bf16": [2.0]}


def test_report_shows_the_trl_method_before_a_full_run() -> None:
    from benchmarks.report import COMMENTARY, render

    other = {"study": "cli-latency", "size": "full", "command": "c", "date": "2026-01-01T00:00:00+00:00",
             "load_before": [0.1, 0.1, 0.1], "load_after": [0.1, 0.1, 0.1], "study_wall_s": 1.0,
             "machine": {"cpu": "c", "cores": 2, "ram_gib": 1.0, "os": "o", "versions": {}, "commit": None},
             "tables": [], "targets": [], "notes": []}
    text = render({"cli-latency": other})
    assert "## 8. TRL GRPOTrainer side by side" in text
    assert "Not run at full size yet: `python -m benchmarks trl-grpo`." in text
    assert (COMMENTARY / "trl-grpo.md").read_text().strip().splitlines()[0] in text


def test_study_without_the_trl_venv_stops_in_one_line(monkeypatch, tmp_path) -> None:
    import benchmarks.trl_grpo as study

    monkeypatch.setattr(study, "TRL_VENV", tmp_path / "no-venv")
    with pytest.raises(SystemExit) as exc:
        study.run("toy", tmp_path)
    assert "make bench-trl-venv" in str(exc.value) and "\n" not in str(exc.value)
    assert not (tmp_path / "trl-grpo.json").exists()


def test_trainer_total_steps_sets_trls_step_count() -> None:
    """`trainer.total_steps` counts versions: TRL trains versions × trigger steps, on the first prompts of the
    stream; too few prompts for them is refused."""
    r = recipe_from_config(load_config(PRESETS / PRESET, ["trainer.total_steps=5", "rollout.total_rollout_steps=200"]))
    assert r["max_steps"] == 5 * 2
    with pytest.raises(SpecError, match="needs 80 prompts"):
        recipe_from_config(load_config(PRESETS / PRESET, ["trainer.total_steps=10", "rollout.total_rollout_steps=40"]))
