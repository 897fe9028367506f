"""Reward functions on hand-made responses, user rewards, and the safe caller."""

from __future__ import annotations

import math as pymath
import textwrap
from pathlib import Path

import pytest

from engine.data import rewards
from engine.data.math_answer import answers_match, last_boxed, normalize_math_answer, numeric_value
from engine.data.rewards import get_reward_fn, safe_score

KW = {"data_source": "", "extra_info": {}, "finished": True}


@pytest.mark.parametrize(
    "response, truth, expected",
    [
        ("She has 3 + 4 = 7.\n#### 7", "7", 1.0),
        ("#### 6\nwait, no: #### 7", "7", 1.0),  # the last answer counts
        ("#### 1,234", "1234", 1.0),  # commas removed
        ("#### -3", "-3", 1.0),
        ("The answer is 7.", "7", 0.0),  # no #### → 0
        ("#### 8", "7", 0.0),  # wrong → format_score 0
        ("####7", "7", 0.0),  # verl's strict pattern needs the space
        ("#### 7" + " filler" * 100, "7", 0.0),  # outside the last 300 characters
    ],
)
def test_gsm8k(response: str, truth: str, expected: float) -> None:
    assert rewards.gsm8k(response, truth, **KW) == expected


def test_gsm8k_format_score() -> None:
    assert rewards.gsm8k("#### 8", "7", **KW, format_score=0.1) == 0.1


@pytest.mark.parametrize(
    "response, truth, expected",
    [
        ("so $\\boxed{\\frac{1}{2}}$", "\\frac12", 1.0),
        ("\\boxed{0.5}", "\\frac{1}{2}", 1.0),
        ("\\boxed{\\dfrac{3}{4}}", "3/4", 1.0),
        ("\\boxed{x = 5}", "5", 1.0),
        ("\\boxed{10\\%}", "10", 1.0),
        ("\\boxed{\\left( 1, 2 \\right)}", "(1,2)", 1.0),
        ("\\boxed{90^\\circ}", "90", 1.0),
        ("\\boxed{2} then \\boxed{\\sqrt3}", "\\sqrt{3}", 1.0),
        ("\\boxed{\\text{(A)}}", "\\text{(A)}", 1.0),
        ("\\boxed{5 \\text{ cm}}", "5", 1.0),
        ("\\boxed{.5}", "0.5", 1.0),
        ("\\boxed{6}", "5", 0.0),
        ("the answer is 5", "5", 0.0),
        ("\\boxed{5", "5", 0.0),  # unbalanced
    ],
)
def test_math(response: str, truth: str, expected: float) -> None:
    assert rewards.math(response, truth, **KW) == expected


def test_math_helpers() -> None:
    assert last_boxed("a \\boxed{\\frac{1}{2}} b \\fbox{3}") == "3"
    assert last_boxed("\\boxed 42$ end") == "42"
    assert last_boxed("none") is None
    assert normalize_math_answer("\\tfrac{1}{2}") == "\\frac{1}{2}"
    assert numeric_value("2\\sqrt{3}") == pytest.approx(2 * 3**0.5)
    assert numeric_value("\\frac{\\pi}{2}") == pytest.approx(pymath.pi / 2)
    assert numeric_value("__import__('os')") is None
    assert numeric_value("9^{9^{9}}") is None
    assert answers_match("3.4641", "2\\sqrt{3}", rel_tol=1e-4)
    assert not answers_match("3.46", "2\\sqrt{3}", rel_tol=1e-4)


@pytest.mark.parametrize(
    "response, truth, score, acc, fmt",
    [
        ("<think>angles sum</think> The answer is \\boxed{30}", "30", 1.0, 1.0, 1.0),
        ("The answer is \\boxed{30}", "30", 0.9, 1.0, 0.0),
        ("<think>x</think> \\boxed{2\\sqrt{3}}", "3.4641016", 1.0, 1.0, 1.0),  # numeric tolerance
        ("<think>x</think> \\boxed{31}", "30", 0.1, 0.0, 1.0),
        ("30", "30", 0.0, 0.0, 0.0),
    ],
)
def test_geo3k(response: str, truth: str, score: float, acc: float, fmt: float) -> None:
    out = rewards.geo3k(response, truth, **KW)
    assert out["score"] == pytest.approx(score) and (out["acc"], out["format"]) == (acc, fmt)


@pytest.mark.parametrize(
    "response, finished, expected",
    [
        ("381", True, 1.0),  # exact + EOS: the only full score
        ("381", False, 0.5),  # the right digits without EOS
        ("3815", True, 0.5),  # the right digits, then more
        ("380", True, 1 / 3 + 0.5),  # stopped at the right place, 2 digits right
        ("38", True, 1 / 3),  # stopped too early
        ("183", True, 1 / 6 + 0.5),
        ("999", False, 0.0),  # wrong
        ("999", True, 0.5),  # wrong digits, but stopped at the right place
        ("", True, 0.0),
        (" 381 ", True, 1.0),
    ],
)
def test_copy(response: str, finished: bool, expected: float) -> None:
    out = rewards.copy(response, "381", data_source="asyncrl/copy", extra_info={}, finished=finished)
    assert out["score"] == pytest.approx(expected)
    assert out["acc"] == (1.0 if expected == 1.0 else 0.0)


def test_copy_stopping_always_pays() -> None:
    """No response without the exact answer + EOS scores as much as one with it, so the training reward
    ranks responses as validation (which counts exact answers) does."""
    exact = rewards.copy("381", "381", **KW)["score"]
    others = [rewards.copy(r, "381", data_source="asyncrl/copy", extra_info={}, finished=f)["score"]
              for r in ("381", "3811", "38", "380", "999", "381 381") for f in (True, False)
              if not (r == "381" and f)]
    assert exact == 1.0 and max(others) < 1.0
    # the right digits without EOS never outscore the right digits with it
    assert rewards.copy("381", "381", **{**KW, "finished": False})["score"] < exact


def test_reverse_scores_against_the_reversed_digits() -> None:
    assert rewards.reverse("183", "183", **KW)["score"] == 1.0
    assert rewards.reverse("381", "183", **KW)["score"] == pytest.approx(1 / 6 + 0.5)


@pytest.mark.parametrize(
    "response, split, score, acc",
    [
        ("Tom has 7 + 2 = 9 apples.\n#### 9", "train", 1.1, 1.0),
        ("Tom has 7 + 2 = 9 apples.\n#### 9", "val", 1.0, 1.0),  # validation: correctness only
        ("Tom has 7 - 2 = 5 apples.\n#### 5", "train", 0.1, 0.0),
        ("Tom has 9 apples.", "train", 0.0, 0.0),
        ("#### 09", "train", 1.1, 1.0),  # numeric comparison
    ],
)
def test_arith(response: str, split: str, score: float, acc: float) -> None:
    out = rewards.arith(response, "9", data_source="asyncrl/arith", extra_info={"split": split},
                        finished=True)
    assert out["score"] == pytest.approx(score) and out["acc"] == acc


@pytest.mark.parametrize(
    "source, name",
    [("openai/gsm8k", "gsm8k"), ("lighteval/MATH", "math"), ("hiyouga/geometry3k", "geo3k"),
     ("asyncrl/copy", "copy"), ("asyncrl/reverse", "reverse"), ("asyncrl/arith", "arith"),
     ("my-gsm8k-variant", "gsm8k"), ("DigitalLearningGmbH/MATH-lighteval", "math")],
)
def test_auto_picks_by_data_source(source: str, name: str) -> None:
    assert get_reward_fn("auto", source) is rewards.BUILTIN_REWARDS[name]


def test_unknown_names_are_clear() -> None:
    with pytest.raises(ValueError, match="data.reward"):
        get_reward_fn("auto", "someone/chess")
    with pytest.raises(ValueError, match="module:function"):
        get_reward_fn("bleu")


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "my_rewards.py").write_text(textwrap.dedent('''
        def exact(response_text, ground_truth, *, data_source, extra_info, finished):
            return {"score": float(response_text.strip() == ground_truth), "len": len(response_text)}

        def short(response_text, ground_truth):
            return 1.0 if len(response_text) < 5 else 0.0

        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            return 0.5 if ground_truth in solution_str and data_source == "ds" else 0.0

        def boom(response_text, ground_truth, **kwargs):
            raise KeyError("no such key")

        def text(response_text, ground_truth, **kwargs):
            return "1.0"

        def nan(response_text, ground_truth, **kwargs):
            return float("nan")

        def nodict(response_text, ground_truth, **kwargs):
            return {"value": 1.0}
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path / "my_rewards.py"


def test_user_module_function(user_module: Path) -> None:
    fn = get_reward_fn("my_rewards:exact")
    result = safe_score(fn, "42", "42", data_source="ds", extra_info={}, finished=True)
    assert result == (1.0, {"len": 2.0}, None)
    assert safe_score(get_reward_fn("my_rewards:short"), "42", "x")[0] == 1.0  # fewer parameters: adapted
    assert safe_score(get_reward_fn("my_rewards:compute_score"), "is 42", "42", data_source="ds")[0] == 0.5
    by_path = get_reward_fn(f"{user_module}:exact")
    assert safe_score(by_path, "7", "7")[0] == 1.0


def test_user_function_import_errors_are_clear(user_module: Path) -> None:
    with pytest.raises(ValueError, match="cannot import reward module 'no_such_module'"):
        get_reward_fn("no_such_module:f")
    with pytest.raises(ValueError, match="has no function 'missing'"):
        get_reward_fn("my_rewards:missing")


@pytest.mark.parametrize(
    "name, error",
    [("boom", "KeyError: 'no such key'"), ("text", "returned str"), ("nan", "non-finite"),
     ("nodict", "without 'score'")],
)
def test_failing_reward_gives_zero_and_an_error(user_module: Path, name: str, error: str) -> None:
    score, info, err = safe_score(get_reward_fn(f"my_rewards:{name}"), "1", "1")
    assert (score, info) == (0.0, {})
    assert err is not None and error in err and "\n" not in err
