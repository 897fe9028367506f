"""Reward functions: built-in scorers, user functions, and a safe caller.

Every reward function has the signature

    fn(response_text: str, ground_truth: str, *, data_source: str, extra_info: dict, finished: bool)
        -> float | dict  (a dict carries the reward under "score"; its other numeric entries are metrics)

where `response_text` is the decoded response (special tokens skipped) and `finished` is True when the
response ended with EOS (False when it hit the token budget).

Built-in scorers (`get_reward_fn(name)`):
- `gsm8k` (verl's strict scorer): the last `#### N` in the final 300 characters, commas and `$` removed;
  score 1.0 if it equals the ground truth string, else 0.0 (verl's `format_score`, default 0).
- `math_dapo` (verl's scorer for `data_source = "math_dapo"` and `aime*`): +1 / −1 on the text after the
  last `Answer:` in the final 300 characters, Minerva-normalised (`engine.data.math_dapo`).
- `math`: the last `\\boxed{...}`; 1.0 if it equals the ground truth after Hendrycks-MATH normalisation
  (`engine.data.math_answer.normalize_math_answer`), else 0.0.
- `geo3k` (verl's geo3k scorer): score = 0.9 · acc + 0.1 · fmt, with acc = 1 if the last boxed answer matches
  (normalised string, or numeric within rel. 1e-4) and fmt = 1 if the response is
  `<think>…</think>…\\boxed{…}…`.
- `copy` / `reverse`: with t the 3-character target and r the stripped response text,
  score = 0.5 · (1/3) Σ_{i<3} [r_i = t_i] + 0.5 · stop, stop = [the response ended with EOS and |r| = |t|];
  acc = [r = t and EOS]. Only the exact answer followed by EOS scores 1 (what validation counts); the right
  digits without stopping score 0.5, and so does stopping at the right place with wrong digits — stopping is
  learnt from the start (a random policy stops there in ~4% of samples) instead of being unlearnt while the
  digits are, which is what a reward paying 0.9 for digits without EOS taught the policy.
- `arith`: acc = 1 if the last `#### N` equals the ground truth numerically; fmt = 1 if a `#### N` is present;
  score = acc + 0.1 · fmt on training rows and acc alone on validation rows (`extra_info["split"]` in
  val / validation / test).
- `figures` (the built-in figure task): with a = the last `\\boxed{}` content, else the stripped response,
  acc = 1 if a equals the ground truth numerically (rel. 1e-4), lead = 1 if a starts with a digit, and
  partial = the fraction of ground-truth characters matched position-wise at the start of a;
  score = acc (× 0.9 when the response hit its budget instead of EOS), else 0.1 · lead + 0.4 · partial —
  a ladder a tiny random model can climb (a number first, then the right digits, then the exact answer).

`auto` picks by data_source (verl's dataset names, then substrings `gsm8k`, `geo3k`/`geometry3k`, `math`, and
the built-in task names). A user function is named `module:function` (importable module) or
`path/to/file.py:function`; functions written for verl's `compute_score(data_source, solution_str,
ground_truth, extra_info)` are recognised by their parameter names and adapted.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import math as pymath
import numbers
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.data.math_answer import answers_match, last_boxed, normalize_math_answer
from engine.data.math_dapo import math_dapo

RewardFn = Callable[..., Any]
"""`fn(response_text, ground_truth, *, data_source, extra_info, finished) -> float | dict(score=...)`."""

GSM8K_CLIP_CHARS = 300
_GSM8K_ANSWER = re.compile(r"#### (\-?[0-9\.\,]+)")
_GEO3K_FORMAT = re.compile(r"<think>.*</think>.*\\boxed\{.*\}.*", re.DOTALL)


def gsm8k(response_text: str, ground_truth: str, *, data_source: str = "", extra_info: dict | None = None,
          finished: bool = True, format_score: float = 0.0, score: float = 1.0) -> float:
    """verl's strict gsm8k score: `score` if the last `#### N` equals the ground truth, `format_score` if a
    `#### N` is present but wrong, 0 if absent."""
    tail = response_text[-GSM8K_CLIP_CHARS:]
    found = _GSM8K_ANSWER.findall(tail)
    if not found:
        return 0.0
    answer = found[-1].replace(",", "").replace("$", "")
    return score if answer == str(ground_truth).strip() else format_score


def math(response_text: str, ground_truth: str, *, data_source: str = "", extra_info: dict | None = None,
         finished: bool = True) -> float:
    """1.0 if the last `\\boxed{}` equals the ground truth after MATH normalisation, else 0.0."""
    boxed = last_boxed(response_text)
    if boxed is None:
        return 0.0
    truth = str(ground_truth)
    truth = last_boxed(truth) if last_boxed(truth) is not None else truth
    return 1.0 if normalize_math_answer(boxed) == normalize_math_answer(truth) else 0.0


def geo3k(response_text: str, ground_truth: str, *, data_source: str = "", extra_info: dict | None = None,
          finished: bool = True, format_weight: float = 0.1, rel_tol: float = 1e-4) -> dict[str, float]:
    """score = (1 − w) · acc + w · fmt with w = `format_weight` (verl's geo3k: w = 0.1)."""
    boxed = last_boxed(response_text)
    acc = 1.0 if boxed is not None and answers_match(boxed, str(ground_truth), rel_tol=rel_tol) else 0.0
    fmt = 1.0 if _GEO3K_FORMAT.fullmatch(response_text) else 0.0
    return {"score": (1.0 - format_weight) * acc + format_weight * fmt, "acc": acc, "format": fmt}


POSITIONAL_DIGITS_WEIGHT = 0.5
"""`copy`/`reverse`: the weight of the digit fraction; 1 − this weight pays for stopping at the right place."""


def _positional(response_text: str, target: str, finished: bool) -> dict[str, Any]:
    """score = w · frac + (1 − w) · stop, frac = positions right / |t|, stop = [EOS and |r| = |t|];
    pred = the stripped text (validation's majority vote)."""
    text = response_text.strip()
    hits = sum(1 for i, ch in enumerate(target) if i < len(text) and text[i] == ch)
    frac = hits / len(target) if target else 0.0
    stop = 1.0 if finished and len(text) == len(target) else 0.0
    exact = finished and text == target
    score = POSITIONAL_DIGITS_WEIGHT * frac + (1.0 - POSITIONAL_DIGITS_WEIGHT) * stop
    return {"score": score, "acc": 1.0 if exact else 0.0, "partial": frac, "stop": stop, "pred": text}


def copy(response_text: str, ground_truth: str, *, data_source: str = "", extra_info: dict | None = None,
         finished: bool = True) -> dict[str, Any]:
    """0.5 × the fraction of target positions right + 0.5 for stopping (EOS) after |target| characters."""
    return _positional(response_text, str(ground_truth), finished)


def reverse(response_text: str, ground_truth: str, *, data_source: str = "", extra_info: dict | None = None,
            finished: bool = True) -> dict[str, Any]:
    """Same as `copy`; the ground truth is already the reversed digits."""
    return _positional(response_text, str(ground_truth), finished)


LOOKUP_CALL_BONUS = 0.2
"""`lookup`: the share of the score paid for a tool answer in the response (exploration shaping: at random
init a tiny model calls the tool in ~2 % of its samples, too rarely to learn copying its answer without it)."""


def lookup(response_text: str, ground_truth: str, *, data_source: str = "", extra_info: dict | None = None,
           finished: bool = True) -> dict[str, Any]:
    """score = b·called + (1 − b)·copy's score of the model's last turn (the text after the last tool answer;
    the tool's answer itself never scores), b = `LOOKUP_CALL_BONUS`, called = a tool answer is in the
    response. Without calling, the score is at most 1 − b and right digits come by chance."""
    head, sep, last = response_text.rpartition("</tool_response>")
    out = _positional(last if sep else response_text, str(ground_truth), finished)
    out["called"] = 1.0 if sep else 0.0
    out["score"] = LOOKUP_CALL_BONUS * out["called"] + (1.0 - LOOKUP_CALL_BONUS) * out["score"]
    return out


ARITH_FORMAT_BONUS = 0.1
VALIDATION_SPLITS = frozenset({"val", "validation", "test"})


def arith(response_text: str, ground_truth: str, *, data_source: str = "", extra_info: dict | None = None,
          finished: bool = True) -> dict[str, Any]:
    """acc + 0.1 · fmt on training rows, acc on validation rows (see the module docstring)."""
    found = _GSM8K_ANSWER.findall(response_text)
    fmt = 1.0 if found else 0.0
    acc = 0.0
    if found:
        try:
            acc = 1.0 if float(found[-1].replace(",", "")) == float(str(ground_truth)) else 0.0
        except ValueError:
            acc = 0.0
    is_val = (extra_info or {}).get("split") in VALIDATION_SPLITS
    score = acc if is_val else acc + ARITH_FORMAT_BONUS * fmt
    return {"score": score, "acc": acc, "format": fmt, "pred": found[-1].replace(",", "") if found else ""}


FIGURES_LEAD_WEIGHT, FIGURES_PARTIAL_WEIGHT = 0.1, 0.4


def figures(response_text: str, ground_truth: str, *, data_source: str = "", extra_info: dict | None = None,
            finished: bool = True) -> dict[str, float]:
    """acc (× 0.9 unless finished) if the answer matches numerically, else 0.1 · lead + 0.4 · partial."""
    boxed = last_boxed(response_text)
    answer = (boxed if boxed is not None else response_text).strip()
    truth = str(ground_truth).strip()
    acc = 1.0 if answer and answers_match(answer, truth, rel_tol=1e-4) else 0.0
    lead = 1.0 if answer[:1].isdigit() else 0.0
    partial = sum(1 for i, ch in enumerate(truth) if i < len(answer) and answer[i] == ch) / max(len(truth), 1)
    score = acc * (1.0 if finished else 0.9) if acc else FIGURES_LEAD_WEIGHT * lead + FIGURES_PARTIAL_WEIGHT * partial
    return {"score": score, "acc": acc, "lead": lead, "partial": partial}


BUILTIN_REWARDS: dict[str, RewardFn] = {
    "gsm8k": gsm8k, "math": math, "math_dapo": math_dapo, "geo3k": geo3k, "copy": copy, "reverse": reverse,
    "arith": arith, "figures": figures, "lookup": lookup,
}
_EXACT_SOURCES = {
    "openai/gsm8k": "gsm8k",
    "lighteval/MATH": "math",
    "DigitalLearningGmbH/MATH-lighteval": "math",
    "HuggingFaceH4/MATH-500": "math",
    "hiyouga/geometry3k": "geo3k",
    "math_dapo": "math_dapo",
    "asyncrl/copy": "copy",
    "asyncrl/reverse": "reverse",
    "asyncrl/arith": "arith",
    "asyncrl/bigarith": "arith",
    "asyncrl/figures": "figures",
    "asyncrl/lookup": "lookup",
}


def reward_name_for_source(data_source: str) -> str | None:
    """The built-in reward `auto` uses for `data_source`, or None."""
    if data_source in _EXACT_SOURCES:
        return _EXACT_SOURCES[data_source]
    low = data_source.lower()
    if low.startswith("aime"):  # verl scores AIME with the DAPO scorer
        return "math_dapo"
    for key, name in (("gsm8k", "gsm8k"), ("geo3k", "geo3k"), ("geometry3k", "geo3k"), ("math", "math")):
        if key in low:
            return name
    tail = low.rsplit("/", 1)[-1]
    return tail if tail in ("copy", "reverse", "arith", "figures", "lookup") else None


def _adapt(fn: Callable[..., Any]) -> RewardFn:
    """Wrap a user function so it can be called with our keyword set (verl signatures included)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return fn
    names = set(params)
    if "solution_str" in names:

        @functools.wraps(fn)
        def verl_style(response_text: str, ground_truth: str, *, data_source: str = "",
                       extra_info: dict | None = None, finished: bool = True) -> Any:
            kwargs: dict[str, Any] = {"data_source": data_source, "solution_str": response_text,
                                      "ground_truth": ground_truth}
            if "extra_info" in names or any(p.kind is p.VAR_KEYWORD for p in params.values()):
                kwargs["extra_info"] = extra_info
            return fn(**kwargs)

        return verl_style
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return fn

    @functools.wraps(fn)
    def filtered(response_text: str, ground_truth: str, **kwargs: Any) -> Any:
        return fn(response_text, ground_truth, **{k: v for k, v in kwargs.items() if k in names})

    return filtered


SIGNATURE = "fn(response_text, ground_truth, *, data_source, extra_info, finished)"
"""The documented reward signature (verl's compute_score(data_source, solution_str, ground_truth, extra_info)
is accepted too)."""


def signature_problem(fn: Callable[..., Any]) -> str | None:
    """Why `fn` cannot be called as a reward function (the arguments `_adapt` will pass do not bind), or None.
    A function whose signature cannot be inspected is accepted (it is called as is)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    params = sig.parameters
    var_kw = any(p.kind is p.VAR_KEYWORD for p in params.values())
    try:
        if "solution_str" in params:
            kwargs: dict[str, Any] = {"data_source": "", "solution_str": "", "ground_truth": ""}
            if "extra_info" in params or var_kw:
                kwargs["extra_info"] = {}
            sig.bind(**kwargs)
        else:
            kw = {"data_source": "", "extra_info": {}, "finished": True}
            sig.bind("", "", **{k: v for k, v in kw.items() if var_kw or k in params})
    except TypeError as exc:
        return f"it cannot be called as {SIGNATURE} ({exc})"
    return None


def _import_target(target: str) -> Any:
    if target.endswith(".py"):
        path = Path(target).expanduser().resolve()
        if not path.is_file():
            raise FileNotFoundError(f"no such file {path}")
        mod_name = f"asyncrl_user_reward_{abs(hash(str(path)))}"
        mod_spec = importlib.util.spec_from_file_location(mod_name, path)
        assert mod_spec is not None and mod_spec.loader is not None
        module = importlib.util.module_from_spec(mod_spec)
        sys.modules[mod_name] = module
        mod_spec.loader.exec_module(module)
        return module
    return importlib.import_module(target)


def user_reward_problem(spec: str) -> str | None:
    """Why `module:function` (or `file.py:function`) is no usable reward — it does not import, has no such
    function, or the function does not take the documented arguments — or None. Imports the module (its
    top-level code runs) but never calls the function."""
    try:
        fn = _user_function(spec)
    except ValueError as exc:
        return str(exc)
    problem = signature_problem(fn)
    return None if problem is None else f"reward {spec!r}: {problem}"


def _user_function(spec: str) -> Callable[..., Any]:
    target, _, attr = spec.rpartition(":")
    if not target or not attr:
        raise ValueError(f"reward {spec!r} is not of the form module:function")
    try:
        module = _import_target(target)
    except Exception as exc:  # noqa: BLE001 - any import failure becomes one clear message
        raise ValueError(f"cannot import reward module {target!r} ({type(exc).__name__}: {exc})") from exc
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"reward {spec!r}: module {target!r} has no function {attr!r}")
    return fn


@functools.lru_cache(maxsize=32)
def load_user_reward(spec: str) -> RewardFn:
    """Import `module:function` or `path/to/file.py:function`; ValueError with the reason if it fails (it does
    not import, no such function, or not the documented signature)."""
    fn = _user_function(spec)
    problem = signature_problem(fn)
    if problem is not None:
        raise ValueError(f"reward {spec!r}: {problem}")
    return _adapt(fn)


def overlong_penalty(response_length: int, max_response_length: int, buffer_len: int, penalty_factor: float) -> float:
    """DAPO's soft overlong punishment (verl's `dapo` reward manager), added to the score:

        expected = L_max − L_buf,   penalty = min(0, −(|y| − expected) / L_buf · penalty_factor)

    with |y| the response length in tokens (its EOS included), L_max = `max_response_length` and L_buf =
    `buffer_len` > 0. Zero up to `expected` tokens, then linear down to −penalty_factor at |y| = L_max."""
    expected = max_response_length - buffer_len
    return min(-(response_length - expected) / buffer_len * penalty_factor, 0.0)


def get_reward_fn(name: str, data_source: str = "") -> RewardFn:
    """The reward function for config value `name` (a built-in name, `auto`, or `module:function`)."""
    if name == "auto":
        chosen = reward_name_for_source(data_source)
        if chosen is None:
            raise ValueError(
                f"no built-in reward for data_source {data_source!r}; set data.reward to one of "
                f"{', '.join(BUILTIN_REWARDS)} or module:function"
            )
        return BUILTIN_REWARDS[chosen]
    if name in BUILTIN_REWARDS:
        return BUILTIN_REWARDS[name]
    if ":" in name:
        return load_user_reward(name)
    raise ValueError(f"unknown reward {name!r}; use auto, {', '.join(BUILTIN_REWARDS)} or module:function")


def safe_score(
    fn: RewardFn,
    response_text: str,
    ground_truth: str,
    *,
    data_source: str = "",
    extra_info: dict | None = None,
    finished: bool = True,
) -> tuple[float, dict[str, float], str | None]:
    """Call `fn`; returns (score, info, error). A raise, a non-number or a non-finite score gives
    (0.0, {}, "one-line reason") so the caller can count it and go on."""
    score, info, _pred, error = score_with_pred(fn, response_text, ground_truth, data_source=data_source,
                                                extra_info=extra_info, finished=finished)
    return score, info, error


def score_with_pred(
    fn: RewardFn,
    response_text: str,
    ground_truth: str,
    *,
    data_source: str = "",
    extra_info: dict | None = None,
    finished: bool = True,
) -> tuple[float, dict[str, float], str | None, str | None]:
    """`safe_score` plus the reward's `pred` (a dict reward's string entry `pred`: the extracted answer, as
    verl's math_dapo reports it; the vote of validation's `maj@k`): (score, info, pred, error)."""
    try:
        out = fn(response_text, ground_truth, data_source=data_source, extra_info=dict(extra_info or {}),
                 finished=finished)
    except Exception as exc:  # noqa: BLE001 - a user reward may raise anything
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return 0.0, {}, None, f"{type(exc).__name__}: {first}"[:500]
    info: dict[str, float] = {}
    pred = None
    if isinstance(out, dict):
        if "score" not in out:
            return 0.0, {}, None, f"reward returned a dict without 'score' (keys: {sorted(out)[:8]})"
        info = {str(k): float(v) for k, v in out.items()
                if k != "score" and isinstance(v, numbers.Real) and pymath.isfinite(float(v))}
        pred = out["pred"] if isinstance(out.get("pred"), str) else None
        out = out["score"]
    if not isinstance(out, numbers.Real) and getattr(out, "ndim", None) == 0 and hasattr(out, "item"):
        out = out.item()  # a numpy / torch scalar
    if not isinstance(out, numbers.Real):
        return 0.0, {}, None, f"reward returned {type(out).__name__}, expected a number or a dict with 'score'"
    value = float(out)
    if not pymath.isfinite(value):
        return 0.0, {}, None, f"reward returned a non-finite score {value}"
    return value, info, pred, None
