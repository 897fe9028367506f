"""Parsers of verl's rollout-correction spec strings (`algorithm.rollout_correction.*`).

- `rollout_is_threshold`: a float C > 0 (truncated IS, w ← min(w, C)) or `"lower_upper"` with
  0 < lower < upper (IcePop: w ← w·1[lower ≤ w ≤ upper]).
- `rollout_rs`: comma-separated options, all of which must pass (AND), duplicates removed in order.
  kN names the divergence estimator on log r, r = π_train/π_rollout (verl's orientation):
  k1 = log r (a ratio band), k2 = ½(log r)², k3 = r − 1 − log r; `token_*` per token, `seq_sum_*` /
  `seq_mean_*` / `seq_max_*` aggregate over the response.
- `rollout_rs_threshold`: one spec per option, comma-separated, or a single spec broadcast to all.
  k1 options take `"lower_upper"` or a single upper bound u (lower = 1/u, so u must be > 1);
  k2/k3 options take a positive upper bound only.

verl removed the values `token`, `sequence` and `geometric` (and the key `rollout_rs_threshold_lower`);
they are rejected with the canonical replacement named.
"""

from __future__ import annotations

RS_OPTIONS: tuple[str, ...] = (
    "token_k1", "token_k2", "token_k3",
    "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
    "seq_mean_k1", "seq_mean_k2", "seq_mean_k3",
    "seq_max_k2", "seq_max_k3",
)  # fmt: skip

LEGACY_RS: dict[str, str] = {"token": "token_k1", "sequence": "seq_sum_k1", "geometric": "seq_mean_k1"}
"""verl's pre-#4544 RS values → the canonical option that replaced them."""


def _float(text: str, what: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{what} {text!r} is not a number") from None


def parse_band(spec: str, what: str) -> tuple[float, float]:
    """`"lower_upper"` → (lower, upper) with 0 < lower < upper."""
    lo_s, _, hi_s = spec.partition("_")
    lo, hi = _float(lo_s, what), _float(hi_s, what)
    if not 0 < lo < hi:
        raise ValueError(f"{what} {spec!r} needs 0 < lower < upper")
    return lo, hi


def parse_is_threshold(value: float | str) -> tuple[float | None, float]:
    """(lower, upper) of the IS weight: lower is None for truncated IS, set for IcePop."""
    if isinstance(value, str) and "_" in value:
        lo, hi = parse_band(value, "rollout_is_threshold")
        return lo, hi
    c = _float(str(value), "rollout_is_threshold")
    if c <= 0:
        raise ValueError(f"rollout_is_threshold must be > 0, got {value!r}")
    return None, c


def parse_rs_options(value: str) -> list[str]:
    """Split and check the RS options; legacy values raise with their replacement named."""
    opts: list[str] = []
    for raw in value.split(","):
        opt = raw.strip()
        if not opt:
            continue
        if opt in LEGACY_RS:
            new = LEGACY_RS[opt]
            example = '"0.999_1.001"' if new.endswith("k1") else "2.0"
            raise ValueError(
                f"rollout_rs={opt!r} was removed from verl; use {new!r} with rollout_rs_threshold like "
                f'{example} (k1 options take a "lower_upper" band; rollout_rs_threshold_lower is gone)'
            )
        if opt not in RS_OPTIONS:
            raise ValueError(f"unknown rollout_rs option {opt!r}; choose from {', '.join(RS_OPTIONS)}")
        if opt not in opts:
            opts.append(opt)
    if not opts:
        raise ValueError("rollout_rs is empty; leave the key out to turn rejection sampling off")
    return opts


def parse_rs_thresholds(options: list[str], value: float | str) -> list[tuple[float | None, float]]:
    """One (lower, upper) per option; lower is None for k2/k3 (upper bound only)."""
    specs = [s.strip() for s in str(value).split(",")] if isinstance(value, str) else [str(value)]
    if len(specs) == 1:
        specs = specs * len(options)
    if len(specs) != len(options):
        raise ValueError(
            f"rollout_rs_threshold has {len(specs)} specs for {len(options)} rollout_rs options; "
            "give one per option or a single one"
        )
    out: list[tuple[float | None, float]] = []
    for opt, spec in zip(options, specs, strict=True):
        what = f"rollout_rs_threshold for {opt}"
        if opt.endswith("k1"):
            if "_" in spec:
                out.append(parse_band(spec, what))
            else:
                u = _float(spec, what)
                if u <= 1:
                    raise ValueError(f"{what} {spec!r}: a single k1 bound u means [1/u, u], so u must be > 1")
                out.append((1 / u, u))
        else:
            if "_" in spec:
                raise ValueError(f"{what} {spec!r}: k2/k3 options take a positive upper bound only")
            u = _float(spec, what)
            if u <= 0:
                raise ValueError(f"{what} must be > 0, got {spec!r}")
            out.append((None, u))
    return out
