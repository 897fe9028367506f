"""DAPO's reward as verl's `dapo` reward manager computes it: the score plus the overlong penalty
min(0, −(|y| − (L_max − L_buf)) / L_buf · penalty_factor), its extra info `overlong_reward` / `overlong`, and the
config that selects it. Expected values are computed by hand from that formula."""

from __future__ import annotations


import pytest
from pydantic import ValidationError

from engine.config.sections import DataConfig
from engine.data.rewards import overlong_penalty
from engine.runtime.scoring import Scorer, validation_record
from engine.plan.role_parts import scoring_spec
from engine.types import GenResult, Prompt


@pytest.mark.parametrize(
    ("length", "l_max", "l_buf", "factor", "expected"),
    [
        (100, 8192, 4096, 1.0, 0.0),  # well inside the budget: no penalty (the min with 0)
        (4096, 8192, 4096, 1.0, 0.0),  # exactly L_max − L_buf: −0/4096 = 0
        (6144, 8192, 4096, 1.0, -0.5),  # halfway through the buffer: −2048/4096
        (8192, 8192, 4096, 1.0, -1.0),  # the full budget: −penalty_factor
        (16, 20, 8, 0.5, -0.25),  # expected 12, exceed 4: −4/8 · 0.5
        (20, 20, 8, 0.0, 0.0),  # factor 0 (verl's default): never a penalty
    ],
)
def test_overlong_penalty_by_hand(length: int, l_max: int, l_buf: int, factor: float, expected: float) -> None:
    assert overlong_penalty(length, l_max, l_buf, factor) == pytest.approx(expected)


class _Tok:
    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(ord("a") + i) for i in ids)


def _scorer(**data) -> Scorer:
    cfg = DataConfig(train_files=["x.parquet"], reward="copy", max_response_length=4, **data)
    return Scorer(scoring_spec(cfg), _Tok())


DAPO = {"reward_manager": "dapo", "overlong_buffer": {"enable": True, "len": 2, "penalty_factor": 1.0, "log": True}}
PROMPT = Prompt(uid="0:0", index=0, epoch=0, prompt_ids=[1], ground_truth="abc", data_source="copy")


def test_the_dapo_manager_adds_the_penalty_to_the_score_and_logs_it() -> None:
    """An exact copy (`copy` score 1.0) of 3 tokens with L_max = 4, L_buf = 2: expected 2, exceed 1 → −0.5."""
    score, info = _scorer(**DAPO)._score(PROMPT, [0, 1, 2], finished=True)
    assert score == pytest.approx(0.5)
    assert info["overlong_reward"] == pytest.approx(-0.5) and info["overlong"] == 1.0 and info["acc"] == 1.0


def test_without_the_dapo_manager_or_with_the_buffer_off_the_score_is_the_reward() -> None:
    assert _scorer()._score(PROMPT, [0, 1, 2], finished=True)[0] == pytest.approx(1.0)
    off = {"reward_manager": "dapo", "overlong_buffer": {"enable": False, "len": 2, "penalty_factor": 1.0}}
    assert _scorer(**off)._score(PROMPT, [0, 1, 2], finished=True)[0] == pytest.approx(1.0)


def test_log_false_penalises_without_the_extra_info() -> None:
    quiet = {**DAPO, "overlong_buffer": {**DAPO["overlong_buffer"], "log": False}}
    score, info = _scorer(**quiet)._score(PROMPT, [0, 1, 2], finished=True)
    assert score == pytest.approx(0.5) and "overlong_reward" not in info and "overlong" not in info


def test_validation_logs_the_overlong_info_in_val_aux() -> None:
    """Two answers: 3 tokens (−0.5) and 1 token (no penalty); val-aux holds their means, as verl logs extra info."""
    short = Prompt(uid="0:1", index=1, epoch=0, prompt_ids=[1], ground_truth="a", data_source="copy")
    scored = [(PROMPT, GenResult("0:0#0", [0, 1, 2], [0.0] * 3, "stop", 0, 0)),
              (short, GenResult("0:1#0", [0], [0.0], "stop", 0, 0))]
    rec, _ = validation_record(_scorer(**DAPO), scored, version=1, step=2)
    assert rec["val-aux/copy/overlong_reward/mean@1"] == pytest.approx(-0.25)
    assert rec["val-aux/copy/overlong/mean@1"] == pytest.approx(0.5)
    assert rec["val-core/copy/acc/mean@1"] == 1.0 and rec["val-aux/copy/reward/mean@1"] == pytest.approx(0.75)


@pytest.mark.parametrize(
    ("data", "why"),
    [
        ({"overlong_buffer": {"enable": True, "len": 2, "penalty_factor": 1.0}}, 'reward_manager = "dapo"'),
        ({"reward_manager": "dapo", "overlong_buffer": {"enable": True, "len": 0}}, "len > 0"),
        ({"reward_manager": "dapo", "overlong_buffer": {"enable": True, "len": 5}}, "exceeds max_response_length"),
        ({"reward_manager": "prime"}, "reward_manager"),
    ],
)
def test_config_refuses_an_overlong_buffer_it_cannot_apply(data: dict, why: str) -> None:
    with pytest.raises(ValidationError, match=why):
        DataConfig(train_files=["x.parquet"], max_response_length=4, **data)


@pytest.mark.parametrize("preset", ["qwen3-30b-a3b-base-dapo-megatron-96-32", "qwen3-30b-a3b-base-dapo-megatron-96-32-mis",
                                    "qwen2.5-math-7b-dapo-fsdp2-64-64"])
def test_the_seed_presets_use_the_overlong_reward_as_their_verl_scripts_do(preset: str) -> None:
    """verl's scripts: reward_manager=dapo, overlong_buffer_cfg enable=True, len=4096, penalty_factor=1.0, log=False,
    max_resp_len = data.max_response_length."""
    from pathlib import Path

    from asyncrl_cli.commands._common import analyze

    an = analyze(Path(__file__).resolve().parents[2] / "presets" / "runs" / f"{preset}.toml", None)
    assert an.config is not None  # the schema accepts it (its memory fit is the memory model's business)
    data = an.config.data
    assert data.reward_manager == "dapo"
    assert data.overlong_buffer.model_dump() == {"enable": True, "len": 4096, "penalty_factor": 1.0, "log": False}


@pytest.mark.parametrize(("response", "truth", "score"), [
    ("Let me think.\nAnswer: 42", "42", 1.0),
    ("so x = 7.\nanswer : x = 7", "7", 1.0),  # case-insensitive; the part after the last "=" counts
    ("Answer: \\frac12", "\\frac{1}{2}", 1.0),  # \fracab -> \frac{a}{b}
    ("Answer: 1,000 dollars", "1000", 1.0),  # spaces and units dropped, thousands separator of an integer
    ("Answer: $\\boxed{5}$", "5", 1.0),
    ("The answer is \\boxed{42}", "42", -1.0),  # no "Answer:" line: [INVALID]
    ("Answer: 41", "42", -1.0),
    ("Answer: 42\n" + "x" * 300, "42", -1.0),  # only the last 300 characters are read
])
def test_math_dapo_scores_plus_or_minus_one_by_hand(response: str, truth: str, score: float) -> None:
    from engine.data.math_dapo import math_dapo

    out = math_dapo(response, truth)
    assert out["score"] == score and out["acc"] == float(score > 0)


def test_auto_picks_the_dapo_scorer_for_verls_dapo_and_aime_sources() -> None:
    from engine.data.math_dapo import math_dapo
    from engine.data.rewards import get_reward_fn

    assert get_reward_fn("auto", "math_dapo") is math_dapo and get_reward_fn("auto", "aime24") is math_dapo
    assert get_reward_fn("auto", "lighteval/MATH") is not math_dapo


def test_the_dapo_manager_adds_the_penalty_to_a_wrong_answers_minus_one() -> None:
    """verl: reward = score + overlong_reward; a wrong answer (−1) at the full budget (−1) gets −2."""
    cfg = DataConfig(train_files=["x.parquet"], reward="math_dapo", max_response_length=4, reward_manager="dapo",
                     overlong_buffer={"enable": True, "len": 2, "penalty_factor": 1.0})
    prompt = Prompt(uid="0:0", index=0, epoch=0, prompt_ids=[1], ground_truth="42", data_source="math_dapo")
    score, info = Scorer(scoring_spec(cfg), _Tok())._score(prompt, [0, 1, 2, 3], finished=False)
    assert score == pytest.approx(-2.0) and info["acc"] == 0.0
