"""verl's rollout-correction presets (`RolloutCorrectionConfig` classmethods) as data.

`algorithm.rollout_correction.preset = "NAME"` expands to the keys of the table below; keys written
explicitly in any layer (or with `--set`) win over the preset. Names are verl's classmethod names;
`-` and `_` are interchangeable. `disabled` turns IS and RS off (metrics only).
"""

from __future__ import annotations

from typing import Any

RC_PRESETS: dict[str, dict[str, Any]] = {
    "decoupled_token_is": {"rollout_is": "token", "rollout_is_threshold": 2.0, "bypass_mode": False},
    "decoupled_seq_is": {"rollout_is": "sequence", "rollout_is_threshold": 2.0, "bypass_mode": False},
    "decoupled_token_icepop": {
        "rollout_is": "token",
        "rollout_is_threshold": "0.5_5.0",
        "bypass_mode": False,
    },
    "decoupled_seq_is_rs": {
        "rollout_is": "sequence",
        "rollout_is_threshold": 2.0,
        "rollout_rs": "seq_sum_k1",
        "rollout_rs_threshold": "0.5_2.0",
        "bypass_mode": False,
    },
    "decoupled_geo_rs": {
        "rollout_rs": "seq_mean_k1",
        "rollout_rs_threshold": "0.999_1.001",
        "bypass_mode": False,
    },
    "decoupled_geo_rs_seq_tis": {
        "rollout_is": "sequence",
        "rollout_is_threshold": 2.0,
        "rollout_rs": "seq_mean_k1",
        "rollout_rs_threshold": "0.999_1.001",
        "bypass_mode": False,
    },
    "decoupled_geo_rs_token_tis": {
        "rollout_is": "token",
        "rollout_is_threshold": 2.0,
        "rollout_rs": "seq_mean_k1",
        "rollout_rs_threshold": "0.999_1.001",
        "bypass_mode": False,
    },
    "decoupled_k3_rs": {"rollout_rs": "seq_mean_k3", "rollout_rs_threshold": 0.01, "bypass_mode": False},
    "decoupled_k3_rs_seq_tis": {
        "rollout_is": "sequence",
        "rollout_is_threshold": 2.0,
        "rollout_rs": "seq_mean_k3",
        "rollout_rs_threshold": 0.01,
        "bypass_mode": False,
    },
    "decoupled_k3_rs_token_tis": {
        "rollout_is": "token",
        "rollout_is_threshold": 2.0,
        "rollout_rs": "seq_mean_k3",
        "rollout_rs_threshold": 0.01,
        "bypass_mode": False,
    },
    "bypass_ppo_clip": {"bypass_mode": True, "loss_type": "ppo_clip"},
    "bypass_ppo_clip_geo_rs": {
        "rollout_rs": "seq_mean_k1",
        "rollout_rs_threshold": "0.999_1.001",
        "bypass_mode": True,
        "loss_type": "ppo_clip",
    },
    "bypass_ppo_clip_k3_rs": {
        "rollout_rs": "seq_mean_k3",
        "rollout_rs_threshold": 0.01,
        "bypass_mode": True,
        "loss_type": "ppo_clip",
    },
    "bypass_pg_is": {
        "rollout_is": "sequence",
        "rollout_is_threshold": 2.0,
        "bypass_mode": True,
        "loss_type": "reinforce",
    },
    "bypass_pg_token_icepop": {
        "rollout_is": "token",
        "rollout_is_threshold": "0.5_5.0",
        "bypass_mode": True,
        "loss_type": "reinforce",
    },
    "bypass_pg_geo_rs": {
        "rollout_rs": "seq_mean_k1",
        "rollout_rs_threshold": "0.999_1.001",
        "bypass_mode": True,
        "loss_type": "reinforce",
    },
    "bypass_pg_geo_rs_seq_tis": {
        "rollout_is": "sequence",
        "rollout_is_threshold": 2.0,
        "rollout_rs": "seq_mean_k1",
        "rollout_rs_threshold": "0.999_1.001",
        "bypass_mode": True,
        "loss_type": "reinforce",
    },
    "bypass_pg_geo_rs_token_tis": {
        "rollout_is": "token",
        "rollout_is_threshold": 2.0,
        "rollout_rs": "seq_mean_k1",
        "rollout_rs_threshold": "0.999_1.001",
        "bypass_mode": True,
        "loss_type": "reinforce",
    },
    "disabled": {"rollout_is": None, "rollout_rs": None, "rollout_rs_threshold": None, "bypass_mode": False},
}
"""Preset name → the `algorithm.rollout_correction` keys it sets (None = key absent, i.e. off)."""


def canonical_preset_name(name: str) -> str:
    """Normalise `decoupled-geo-rs` / `Decoupled_Geo_RS` to verl's `decoupled_geo_rs`."""
    return name.strip().lower().replace("-", "_")


def expand_preset(name: str, explicit: dict[str, Any]) -> dict[str, Any]:
    """The rollout_correction table with preset keys filled in under the explicitly written ones."""
    keys = RC_PRESETS[canonical_preset_name(name)]
    merged = dict(keys)
    merged.update(explicit)
    return merged
