"""Parsing and validation of the `algorithm.rollout_correction` knobs (verl 0.9 grammar) — the one parser of
verl's spec strings: the schema validates with it and the engine and the CLI's checks import it from here, so
`validate` and the run reject the same values with the same messages. Dependency-free (no torch).

IS threshold (`rollout_is_threshold`):
    float C or "C"   -> TIS: w ← min(w, C)                       (upper, lower=None)
    "lo_hi"          -> IcePop: w ← w·1[lo ≤ w ≤ hi]             (upper=hi, lower=lo), 0 < lo < hi

RS options (`rollout_rs`, comma separated, all must pass, duplicates dropped):
    token_k1|k2|k3, seq_sum_k1|k2|k3, seq_mean_k1|k2|k3, seq_max_k2|k3
RS thresholds (`rollout_rs_threshold`, one spec per option, comma separated; a single spec is broadcast):
    k1 options: "lo_hi", or a float u > 1 meaning lo = 1/u, hi = u. verl's k1 statistic is
                log(π_rollout/π_train) = −log(π_train/π_rollout), so the bounds apply to the ratio
                **π_rollout/π_train** (for `seq_mean_k1`: its geometric mean); see `rollout_correction`.
    k2/k3     : a positive upper bound only ("_" is an error).
Every bound must be a finite positive number.

Legacy values from verl's #3984 era (`rollout_rs` = token | sequence | geometric, `rollout_is` = geometric) raise
ValueError naming the modern replacement (`LEGACY_RS`). The legacy modes bounded π_train/π_rollout (per token,
its product, its geometric mean), the inverse of the k1 options that replaced them, so a legacy band
"lo_hi" becomes "1/hi_1/lo" (`invert_band`; identical for reciprocal bounds like 0.5_2.0).
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

LEGACY_RS: dict[str, str] = {"token": "token_k1", "sequence": "seq_sum_k1", "geometric": "seq_mean_k1"}
"""verl's pre-#4544 RS values → the canonical option that replaced them."""
_LEGACY_WHAT = {"token": "π_train/π_rollout per token", "sequence": "Π_t π_train/π_rollout",
                "geometric": "the geometric mean of π_train/π_rollout"}
_LEGACY_IS = {"geometric": "there is no geometric IS level; use rollout_is='sequence' or 'token', "
                           "or geometric rejection with rollout_rs='seq_mean_k1'"}


def invert_band(lower: float, upper: float) -> tuple[float, float]:
    """A legacy band on π_train/π_rollout as the k1 band on π_rollout/π_train: (1/upper, 1/lower)."""
    return 1.0 / upper, 1.0 / lower


def _number(text: str, what: str) -> float:
    """A finite float from `text`, else ValueError naming `what`."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{what} {text!r} is not a number") from None
    if not math.isfinite(value):
        raise ValueError(f"{what} must be a finite number, got {text!r}")
    return value


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
    what = "rollout_is_threshold"
    if isinstance(spec, bool):
        raise TypeError(f"{what} must be a float or a 'lo_hi' string, not a boolean")
    if not isinstance(spec, (int, float, str)):
        raise TypeError(f"{what} must be a float or a 'lo_hi' string, got {type(spec).__name__}")
    text = str(spec).strip()
    if not text:
        raise ValueError(f"{what} must not be an empty string")
    if "_" in text:
        lo_s, _, hi_s = text.partition("_")
        lower, upper = _number(lo_s, what), _number(hi_s, what)
        if not 0 < lower < upper:
            raise ValueError(f"{what} {spec!r} needs 0 < lower < upper")
        return upper, lower
    upper = _number(text, what)
    if not upper > 0:
        raise ValueError(f"{what} must be > 0, got {spec!r}")
    return upper, None


def check_is_level(rollout_is: str) -> None:
    """Raise ValueError for an unknown or legacy IS level."""
    if rollout_is in _LEGACY_IS:
        raise ValueError(f"rollout_is={rollout_is!r} was removed in verl 0.9: {_LEGACY_IS[rollout_is]}")
    if rollout_is not in IS_LEVELS:
        raise ValueError(f"invalid rollout_is {rollout_is!r}; expected one of {IS_LEVELS} or None")


def parse_rs_options(rollout_rs: str) -> list[str]:
    """The RS options of a comma-separated spec, in order, duplicates removed; legacy names rejected."""
    if not isinstance(rollout_rs, str) or not rollout_rs.strip():
        raise ValueError("rollout_rs is empty; leave the key out to turn rejection sampling off")
    options: list[str] = []
    for raw in rollout_rs.split(","):
        opt = raw.strip()
        if not opt:
            continue
        if opt in LEGACY_RS:
            new = LEGACY_RS[opt]
            raise ValueError(
                f"rollout_rs={opt!r} was removed from verl; use {new!r} with a rollout_rs_threshold band like "
                f'"0.999_1.001" (rollout_rs_threshold_lower is gone). The legacy mode bounded '
                f"{_LEGACY_WHAT[opt]}; {new} bounds the inverse, so a legacy 'lo_hi' becomes '1/hi_1/lo'")
        if opt not in RS_OPTIONS:
            raise ValueError(f"unknown rollout_rs option {opt!r}; choose from {', '.join(RS_OPTIONS)}")
        if opt not in options:
            options.append(opt)
    if not options:
        raise ValueError("rollout_rs is empty; leave the key out to turn rejection sampling off")
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
            f"rollout_rs_threshold has {len(specs)} specs for {len(options)} rollout_rs options; "
            "give one per option or a single one"
        )
    if len(specs) == 1:
        specs = specs * len(options)
    return [_parse_one_rs(opt, s) for opt, s in zip(options, specs)]


def _parse_one_rs(option: str, spec: str) -> RSThreshold:
    what = f"rollout_rs_threshold for {option}"
    if option.endswith("k1"):
        if "_" in spec:
            lo_s, _, hi_s = spec.partition("_")
            lower, upper = _number(lo_s, what), _number(hi_s, what)
            if not 0 < lower < upper:
                raise ValueError(f"{what} {spec!r} needs 0 < lower < upper")
            return RSThreshold(option=option, upper=upper, lower=lower)
        u = _number(spec, what)
        if not u > 1:
            raise ValueError(f"{what} {spec!r}: a single k1 bound u means [1/u, u], so u must be > 1")
        return RSThreshold(option=option, upper=u, lower=1.0 / u)
    if "_" in spec:
        raise ValueError(f"{what} {spec!r}: k2/k3 options take a positive upper bound only")
    u = _number(spec, what)
    if not u > 0:
        raise ValueError(f"{what} must be > 0, got {spec!r}")
    return RSThreshold(option=option, upper=u, lower=None)


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
