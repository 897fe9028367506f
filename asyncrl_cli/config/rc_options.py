"""verl's rollout-correction spec strings, for the config schema: re-exported from the engine's dependency-free
parser `engine.config.rc_config` (the one implementation; its docstring has the grammar and the k1 orientation:
k1 bounds apply to π_rollout/π_train)."""

from __future__ import annotations

from engine.config.rc_config import (
    LEGACY_RS,
    RS_OPTIONS,
    RSThreshold,
    invert_band,
    parse_is_threshold,
    parse_rs_options,
    parse_rs_thresholds,
)

__all__ = ["LEGACY_RS", "RS_OPTIONS", "RSThreshold", "invert_band", "parse_is_threshold", "parse_rs_options",
           "parse_rs_thresholds"]
