"""Turn pydantic validation errors into located `Problem`s, with "did you mean" for unknown keys."""

from __future__ import annotations

import difflib
from typing import Any

from pydantic import ValidationError

from asyncrl_cli.config.problems import Problem
from asyncrl_cli.config.provenance import Provenance
from asyncrl_cli.config.schema_paths import field_paths, submodel_at

KNOWN_MISTAKES: dict[str, str] = {
    "n_gpus_per_node": "asyncrl calls it gpus_per_node (resources.trainer / resources.rollout)",
    "n_gpus_training": "write resources.trainer.gpus_per_node",
    "n_gpus_rollout": "write resources.rollout.gpus_per_node",
    "rollout_rs_threshold_lower": (
        'removed in verl: write rollout_rs_threshold = "lower_upper", e.g. "0.999_1.001"'
    ),
    "rollout_token_veto_threshold": "removed in verl (#4544); there is no veto any more",
    "use_rollout_log_probs": "removed in verl; bypass_mode decides which log-probs act as π_old",
    "compute_prox_log_prob": "removed in verl; write algorithm.rollout_correction.bypass_mode = false",
    "lr_warmup_steps": "asyncrl calls it trainer.optim.warmup_steps",
    "tensor_model_parallel_size": "rollout.tensor_parallel_size (rollout) or trainer.tp (megatron)",
    "train_batch_size": "unused in fully async (verl asserts 0); the unit is trainer.ppo_mini_batch_size",
    "gen_batch_size": "unused: prompts stream one at a time",
    "actor_rollout_ref": "a verl key: convert a verl script with `asyncrl import verl SCRIPT.sh`",
    "strategy": 'write trainer.backend = "torch" (FSDP2) or "megatron"',
}
"""verl spellings and removed keys → what to write instead."""


def suggest_key(loc: tuple[str, ...]) -> str | None:
    """The closest valid key path for an unknown key at `loc`."""
    parent, leaf = loc[:-1], loc[-1]
    model = submodel_at(parent)
    if model is not None:
        close = difflib.get_close_matches(leaf, list(model.model_fields), n=1, cutoff=0.6)
        if close:
            return ".".join((*parent, close[0]))
    paths = field_paths()
    same = [p for p in paths if p.rsplit(".", 1)[-1] == leaf]
    if same:
        return same[0]
    leaves: dict[str, str] = {}
    for p in paths:
        leaves.setdefault(p.rsplit(".", 1)[-1], p)
    close = difflib.get_close_matches(leaf, list(leaves), n=1, cutoff=0.75)
    return leaves[close[0]] if close else None


def _key_of(loc: tuple[Any, ...]) -> tuple[tuple[str, ...], str]:
    """Split a pydantic loc into the config key (dropping union-member tags) and its display form."""
    parts: list[str] = []
    shown = ""
    model_path: tuple[str, ...] = ()
    for i, p in enumerate(loc):
        if isinstance(p, int):
            shown += f"[{p}]"
            continue
        model = submodel_at(model_path)
        if model is None or p not in model.model_fields:
            if i == len(loc) - 1 and model is not None:  # the unknown key itself
                parts.append(p)
                shown += ("." if shown else "") + p
            break
        parts.append(p)
        model_path = (*model_path, p)
        shown += ("." if shown else "") + p
    return tuple(parts), shown


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def problems_from_validation(exc: ValidationError, prov: Provenance) -> list[Problem]:
    """One Problem per offending key (union alternatives merged), located through provenance."""
    by_key: dict[str, Problem] = {}
    for err in exc.errors():
        loc = tuple(err["loc"])
        parts, shown = _key_of(loc)
        dotted = ".".join(parts)
        origin = prov.get(dotted)
        kind = err["type"]
        msg = err["msg"].removeprefix("Value error, ")
        hint = None
        if kind == "extra_forbidden":
            msg = "unknown key"
            leaf = parts[-1] if parts else str(loc[-1])
            hint = KNOWN_MISTAKES.get(leaf)
            guess = suggest_key(parts) if parts else None
            if guess:
                hint = f"did you mean '{guess}'?" + (f" ({hint})" if hint else "")
        elif kind == "missing":
            msg = "required key is not set"
        elif "input" in err and kind not in ("value_error",):
            msg = f"{msg} (got {_short(err['input'])})"
        file = origin.source if origin.kind != "default" else prov.root
        line = origin.line if origin.kind != "default" else None
        if dotted in by_key:
            prev = by_key[dotted]
            if msg not in prev.message:
                by_key[dotted] = Problem(
                    "error", prev.code, f"{prev.message}; or {msg}", prev.key, prev.file, prev.line, prev.hint
                )
            continue
        by_key[dotted] = Problem("error", f"schema-{kind}", msg, shown or dotted, file, line, hint)
    return list(by_key.values())
