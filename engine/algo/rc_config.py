"""Parsing and validation of the `algorithm.rollout_correction` knobs (verl 0.9 grammar).

IS threshold (`rollout_is_threshold`):
    float C or "C"   -> TIS: w ← min(w, C)                       (upper, lower=None)
    "lo_hi"          -> IcePop: w ← w·1[lo ≤ w ≤ hi]             (upper=hi, lower=lo)

RS options (`rollout_rs`, comma separated, all must pass, duplicates dropped):
    token_k1|k2|k3, seq_sum_k1|k2|k3, seq_mean_k1|k2|k3, seq_max_k2|k3
RS thresholds (`rollout_rs_threshold`, one spec per option, comma separated; a single spec is broadcast):
    k1 options: "lo_hi", or a float u meaning lo = 1/u, hi = u. The bounds apply to the ratio
                π_rollout/π_train (verl's k1 = −log(π_train/π_rollout)); see `rollout_correction`.
    k2/k3     : a positive upper bound only ("_" is an error).

Legacy values from verl's #3984 era (`rollout_rs` = token | sequence | geometric, `rollout_is` = geometric) raise
ValueError naming the modern replacement.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

RS_OPTIONS: tuple[str, ...] = (
    "token_k1", "token_k2", "token_k3",
    "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
    "seq_mean_k1", "seq_mean_k2", "seq_mean_k3",
    "seq_max_k2", "seq_max_k3",
)
TOKEN_RS_OPTIONS: frozenset[str] = frozenset({"token_k1", "token_k2", "token_k3"})
IS_LEVELS: tuple[str, ...] = ("token", "sequence")
LOSS_TYPES: tuple[str, ...] = ("ppo_clip", "reinforce")

_LEGACY_RS = {
    "token": "rollout_rs='token_k1' (bounds on π_rollout/π_train per token)",
    "sequence": "rollout_rs='seq_sum_k1' (bounds on Π_t π_rollout/π_train)",
    "geometric": (
        "rollout_rs='seq_mean_k1'; note its bounds apply to the geometric mean of π_rollout/π_train, the inverse "
        "of the legacy mode, so legacy 'lo_hi' becomes '1/hi_1/lo' (identical for reciprocal bounds like 0.5_2.0)"
    ),
}
_LEGACY_IS = {"geometric": "there is no geometric IS level; use rollout_is='sequence' or 'token', "
                           "or geometric rejection with rollout_rs='seq_mean_k1'"}


@dataclass(frozen=True)
class RSThreshold:
    """Bounds of one RS option: k1 options have both (ratio space), k2/k3 only `upper`."""

    option: str
    upper: float
    lower: float | None = None

    @property
    def is_k1(self) -> bool:
        return self.option.endswith("k1")

    @property
    def level(self) -> str:
        return "token" if self.option in TOKEN_RS_OPTIONS else "sequence"


def parse_is_threshold(spec: float | str) -> tuple[float, float | None]:
    """(upper, lower-or-None) of an IS threshold spec; lower is set only for IcePop "lo_hi"."""
    if isinstance(spec, bool):
        raise TypeError("rollout_is_threshold must be a float or a 'lo_hi' string, not a boolean")
    if isinstance(spec, (int, float)):
        upper, lower = float(spec), None
    elif isinstance(spec, str):
        text = spec.strip()
        if not text:
            raise ValueError("rollout_is_threshold must not be an empty string")
        try:
            if "_" in text:
                lo, hi = text.split("_", 1)
                lower, upper = float(lo), float(hi)
            else:
                upper, lower = float(text), None
        except ValueError as exc:
            raise ValueError(f"invalid rollout_is_threshold {spec!r}: expected a float or 'lo_hi'") from exc
    else:
        raise TypeError(f"rollout_is_threshold must be a float or a 'lo_hi' string, got {type(spec).__name__}")
    if not upper > 0:
        raise ValueError(f"rollout_is_threshold upper bound must be positive, got {upper}")
    if lower is not None:
        if not lower > 0:
            raise ValueError(f"rollout_is_threshold lower bound must be positive, got {lower}")
        if lower > upper:
            raise ValueError(f"rollout_is_threshold lower bound {lower} exceeds upper bound {upper}")
    return upper, lower


def check_is_level(rollout_is: str) -> None:
    """Raise ValueError for an unknown or legacy IS level."""
    if rollout_is in _LEGACY_IS:
        raise ValueError(f"rollout_is={rollout_is!r} was removed in verl 0.9: {_LEGACY_IS[rollout_is]}")
    if rollout_is not in IS_LEVELS:
        raise ValueError(f"invalid rollout_is {rollout_is!r}; expected one of {IS_LEVELS} or None")


def parse_rs_options(rollout_rs: str) -> list[str]:
    """The RS options of a comma-separated spec, in order, duplicates removed; legacy names rejected."""
    if not isinstance(rollout_rs, str) or not rollout_rs.strip():
        raise ValueError("rollout_rs must be a non-empty comma-separated string of RS options")
    options: list[str] = []
    for raw in rollout_rs.split(","):
        opt = raw.strip()
        if not opt:
            continue
        if opt in _LEGACY_RS:
            raise ValueError(f"rollout_rs={opt!r} is a legacy mode removed in verl 0.9; use {_LEGACY_RS[opt]}")
        if opt not in RS_OPTIONS:
            raise ValueError(f"invalid rollout_rs option {opt!r}; expected one of {list(RS_OPTIONS)}")
        if opt not in options:
            options.append(opt)
    if not options:
        raise ValueError("rollout_rs must contain at least one option")
    return options


def parse_rs_thresholds(options: list[str], spec: float | str | None) -> list[RSThreshold]:
    """One RSThreshold per option (a single spec is broadcast to every option)."""
    if spec is None:
        raise ValueError("rollout_rs_threshold must be set when rollout_rs is set")
    if isinstance(spec, bool):
        raise TypeError("rollout_rs_threshold must be a number or a string, not a boolean")
    if isinstance(spec, (int, float)):
        specs = [str(spec)]
    elif isinstance(spec, str):
        specs = [part.strip() for part in spec.split(",") if part.strip()]
    else:
        raise TypeError(f"rollout_rs_threshold must be a number or a string, got {type(spec).__name__}")
    if not specs:
        raise ValueError("rollout_rs_threshold must contain at least one threshold")
    if len(specs) not in (1, len(options)):
        raise ValueError(
            f"rollout_rs_threshold has {len(specs)} specs for {len(options)} rollout_rs options {options}; "
            "give one shared spec or exactly one per option"
        )
    if len(specs) == 1:
        specs = specs * len(options)
    return [_parse_one_rs(opt, s) for opt, s in zip(options, specs)]


def _parse_one_rs(option: str, spec: str) -> RSThreshold:
    try:
        if option.endswith("k1"):
            if "_" in spec:
                lo_s, hi_s = spec.split("_", 1)
            else:
                hi_s, lo_s = spec, str(1.0 / float(spec))
            lower, upper = float(lo_s), float(hi_s)
        else:
            if "_" in spec:
                raise ValueError(
                    f"rollout_rs_threshold for {option!r} takes a single upper bound without '_', got {spec!r}"
                )
            lower, upper = None, float(spec)
    except ZeroDivisionError as exc:
        raise ValueError(f"threshold for {option!r} must be positive, got {spec!r}") from exc
    except ValueError as exc:
        if "single upper bound" in str(exc):
            raise
        raise ValueError(f"invalid threshold {spec!r} for rollout_rs option {option!r}") from exc
    if not upper > 0 or (lower is not None and not lower > 0):
        raise ValueError(f"thresholds for {option!r} must be positive, got {spec!r}")
    if lower is not None and lower > upper:
        raise ValueError(f"thresholds for {option!r} need lower <= upper, got {spec!r}")
    return RSThreshold(option=option, upper=upper, lower=lower)


def k1_log_bounds(th: RSThreshold) -> tuple[float, float]:
    """(log lower, log upper) of a k1 option, the bounds its statistic −Δ is compared with."""
    assert th.lower is not None
    return math.log(th.lower), math.log(th.upper)


def validate_rc_config(rc: Any) -> list[str]:
    """Check an `algorithm.rollout_correction` section (any object with verl's attribute names).

    Raises ValueError/TypeError on errors (legacy names, bad thresholds, unknown loss_type); returns warnings.
    """
    warnings: list[str] = []
    rollout_is = getattr(rc, "rollout_is", None)
    bypass = bool(getattr(rc, "bypass_mode", False))
    loss_type = getattr(rc, "loss_type", "ppo_clip")
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"invalid loss_type {loss_type!r}; expected one of {LOSS_TYPES}")
    if rollout_is is not None:
        check_is_level(rollout_is)
        threshold = getattr(rc, "rollout_is_threshold", 2.0)
        if threshold is None:
            raise ValueError("rollout_is is set but rollout_is_threshold is None")
        parse_is_threshold(threshold)
    rollout_rs = getattr(rc, "rollout_rs", None)
    if rollout_rs is not None:
        parse_rs_thresholds(parse_rs_options(rollout_rs), getattr(rc, "rollout_rs_threshold", None))
    if bypass and loss_type == "ppo_clip" and rollout_is is not None:
        warnings.append(
            f"rollout_is={rollout_is!r} has no effect on the loss in bypass mode with loss_type='ppo_clip' "
            "(the PPO ratio π_θ/π_rollout already corrects; the weights are logged as metrics only); "
            "use loss_type='reinforce' or bypass_mode=false to apply them"
        )
    if not bypass and loss_type != "ppo_clip":
        warnings.append(f"loss_type={loss_type!r} only applies in bypass mode; decoupled mode uses PPO-clip")
    return warnings
