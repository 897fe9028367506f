"""verl's Hydra override values → Python values, as `convert` maps them: each converter returns the value asyncrl
uses or raises ValueError (the override is then an error of the conversion, never a crash)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from asyncrl_cli.verl_import.shell import concrete

AR = "actor_rollout_ref"
ACTOR = f"{AR}.actor"
ROLL = f"{AR}.rollout"
RC = "algorithm.rollout_correction"


def _unquote(v: str) -> str:
    v = v.strip()
    if len(v) >= 2 and v[0] == v[-1] and v[0] in "'\"":
        return v[1:-1]
    return v


def to_bool(v: str) -> bool:
    """Hydra booleans."""
    s = concrete(_unquote(v)).lower()
    if s in ("true", "1", "yes"):
        return True
    if s in ("false", "0", "no"):
        return False
    raise ValueError(f"not a boolean: {v!r}")


def to_int(v: str) -> int:
    """Hydra ints (symbolic env defaults use their default): a whole, finite number (`1e3` is 1000)."""
    x = to_float(v)
    if x != int(x):
        raise ValueError(f"not a whole number: {v!r}")
    return int(x)


def to_float(v: str) -> float:
    """Hydra floats: finite ones (`1e999`, `inf` and `nan` are refused)."""
    x = float(concrete(_unquote(v)))
    if not math.isfinite(x):
        raise ValueError(f"not a finite number: {v!r}")
    return x


def to_str(v: str) -> str:
    """A string, keeping `${ENV:-default}` overrides."""
    return _unquote(v)


def to_scalar(v: str) -> bool | int | float | str:
    """A Hydra scalar as Hydra types it: a boolean (`true` / `True`), a whole or finite number, else a string (a
    quoted value stays a string). `null` is refused: a run file (TOML) cannot hold it."""
    if v.strip()[:1] in ("'", '"'):
        return _unquote(v)
    s = concrete(v.strip())
    if s.lower() in ("null", "none", "~"):
        raise ValueError("null cannot be written into a run file: leave the key out")
    if s.lower() in ("true", "false"):
        return s.lower() == "true"
    try:
        return int(s)
    except ValueError:
        pass
    try:
        return to_float(s)
    except ValueError:
        return s


def to_list(v: str) -> list[str]:
    """`['a','b']`, `[a,b]` or a single value → list of strings."""
    s = _unquote(v)
    if s.startswith("[") and s.endswith("]"):
        return [_unquote(x) for x in s[1:-1].split(",") if x.strip()]
    return [s]


def to_threshold(v: str) -> float | str:
    """A float, or a `"lower_upper"` spec kept as a string."""
    s = _unquote(concrete(v)) if "$" in v else _unquote(v)
    try:
        x = float(s)
    except ValueError:
        return s
    if not math.isfinite(x):
        raise ValueError(f"not a finite number: {v!r}")
    return x


def to_top_k(v: str) -> int:
    """verl's −1 (off, vLLM) → asyncrl's 0 (off)."""
    return max(0, to_int(v))


def to_sinks(v: str) -> list[str]:
    """`trainer.logger` → sinks (jsonl always first; unknown loggers dropped)."""
    known = ("console", "tensorboard", "wandb")
    return ["jsonl", *[x for x in to_list(v) if x in known]]


def to_every(v: str) -> int:
    """`save_freq` (−1 = never) → `every_versions` (0 = only at the end)."""
    return max(0, to_int(v))


def to_backend(v: str) -> str:
    """fsdp/fsdp2 → torch, megatron → megatron."""
    s = to_str(v)
    if s in ("fsdp", "fsdp2"):
        return "torch"
    if s == "megatron":
        return "megatron"
    raise ValueError(f"no asyncrl trainer backend for strategy {s!r}")


def one_of(allowed: tuple[str, ...], refusal: str) -> Callable[[str], str]:
    """A string converter that keeps a value in `allowed`; any other is refused (`refusal`, formatted with the
    value as `{s!r}`)."""

    def inner(v: str) -> str:
        s = to_str(v)
        if s not in allowed:
            raise ValueError(refusal.format(s=s))
        return s

    return inner


to_rollout_backend = one_of(("vllm",), "no asyncrl rollout backend for {s!r} (vllm or hf)")
"""vllm → vllm (sglang/trtllm have no asyncrl backend)."""
to_reward_manager = one_of(("naive", "dapo"), "reward manager {s!r} is not in asyncrl (naive or dapo)")
"""verl's reward managers asyncrl has: `naive` (the score) and `dapo` (the score + the overlong buffer)."""
to_tool_format = one_of(("hermes",), "tool-call format {s!r} is not in asyncrl (hermes)")
"""verl's `multi_turn.format`: asyncrl parses `hermes` tool calls (`<tool_call>{json}</tool_call>`)."""
to_loss_mode = one_of(("vanilla", "gspo", "geo_mean"),
                      "policy loss {s!r} is not in asyncrl (supported: vanilla, gspo, geo_mean)")
"""verl's `actor.policy_loss.loss_mode` → `trainer.loss_mode`: PPO-clip, GSPO and GMPO; verl's others are refused."""
to_load_balancing = one_of(("none", "aux_loss", "seq_aux_loss"), "MoE load-balancing type {s!r} is not in asyncrl "
                           "(none, aux_loss, seq_aux_loss)")
"""Megatron's `moe_router_load_balancing_type` → `trainer.moe_router_load_balancing_type`."""


def to_attn_implementation(v: str) -> str:
    """transformers' `attn_implementation`: sdpa / eager kept; flash_attention_2/3 → sdpa (the same attention,
    which runs flash kernels on GPU through `scaled_dot_product_attention`)."""
    s = to_str(v)
    if s in ("sdpa", "eager"):
        return s
    if s in ("flash_attention_2", "flash_attention_3"):
        return "sdpa"
    raise ValueError(f"attention implementation {s!r} is not in asyncrl (sdpa, eager, or flash_attention_2 → sdpa)")


def to_tool_config(v: str) -> str:
    """verl's `tool_config_path`, kept as written. When the file is at hand (relative paths from the directory
    the import runs in, as verl's scripts run from verl's root) its tools must be ones asyncrl runs
    (`engine.agent.tools.from_verl_yaml`: a class of yours must be a file it finds, never imported here; verl's
    own classes without an asyncrl equivalent are refused); else `asyncrl validate` checks it."""
    from pathlib import Path

    s = to_str(v)
    if "$" not in s and Path(s).is_file():
        from engine.agent.tools import from_verl_yaml

        from_verl_yaml(s)  # its ValueError names every tool asyncrl cannot run
    return s


def to_optional(conv: Callable[[str], Any]) -> Callable[[str], Any]:
    """`null` → None (the key is left out)."""

    def inner(v: str) -> Any:
        return None if _unquote(v) in ("null", "None", "~") else conv(v)

    return inner


def to_bool_safe(v: str) -> bool:
    """A boolean, or False when the value is not one."""
    try:
        return to_bool(v)
    except ValueError:
        return False
