"""Load a run config: layers → schema → derived quantities → checks, with every problem located.

`load_run_config(path, overrides)` is what the engine and the commands call. `analyze_run_config` returns
the same plus what `validate --json` shows: model facts, hardware, derived quantities and memory fit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from pydantic import ValidationError

from asyncrl_cli.config import checks, data_checks
from engine.plan.sizes import Derived, dataset_train_size, derive
from asyncrl_cli.config.determinism_checks import determinism_rules
from asyncrl_cli.config.fit import FitReport, estimate_fit
from engine.plan.hardware import HardwareInvalid, HardwareNotFound, HardwarePreset, load_hardware
from asyncrl_cli.config.hf_model import ModelConfigError, ModelFacts, read_model_facts
from asyncrl_cli.config.perf_checks import perf_rules
from asyncrl_cli.config.replica_checks import replica_rules
from asyncrl_cli.config.model_checks import checkpoint_disk_rules
from asyncrl_cli.config.layering import resolve_layers
from asyncrl_cli.config.problems import Problem, exit_code_for, sorted_problems
from asyncrl_cli.config.provenance import Provenance
from engine.config.schema import RunConfig
from asyncrl_cli.config.schema_errors import problems_from_validation

_FATAL_LAYER_CODES = {"toml-syntax", "read-error"}


class LoadResult(NamedTuple):
    """`(config, provenance, problems)`; config is None when any error made it invalid."""

    config: RunConfig | None
    provenance: Provenance
    problems: list[Problem]


@dataclass
class Analysis:
    """Everything `validate` reports about one run config."""

    config: RunConfig | None
    provenance: Provenance
    problems: list[Problem]
    hardware: HardwarePreset | None = None
    model: ModelFacts | None = None
    model_note: str | None = None
    derived: Derived | None = None
    fit: FitReport | None = None

    @property
    def exit_code(self) -> int:
        """0 valid, 1 invalid, 3 does not fit."""
        return exit_code_for(self.problems)

    def to_json(self) -> dict[str, Any]:
        """The `validate --json` object."""
        cfg = self.config
        model: dict[str, Any] = {
            "path": cfg.model.path if cfg else None,
            "params_total": None,
            "params_active": None,
            "note": self.model_note,
        }
        if self.model is not None:
            model.update(self.model.to_json())
        return {
            "file": self.provenance.root,
            "valid": self.exit_code == 0,
            "exit_code": self.exit_code,
            "model": model,
            "hardware": self.hardware.model_dump() if self.hardware else None,
            "derived": self.derived.to_json() if self.derived else None,
            "memory": self.fit.to_json() if self.fit else None,
            "problems": [p.to_json() for p in self.problems],
        }


def locate(problems: list[Problem], prov: Provenance) -> list[Problem]:
    """Fill file and line from the provenance of each problem's key (the root file for defaults)."""
    out = []
    for p in problems:
        if p.file is None and p.key is not None:
            o = prov.get(p.key)
            if o.kind == "default":
                p = dataclasses.replace(p, file=prov.root)
            else:
                p = dataclasses.replace(p, file=o.source, line=o.line)
        out.append(p)
    return out


def _substitute_name(cfg: RunConfig) -> None:
    cfg.logging.run_dir = cfg.logging.run_dir.replace("${name}", cfg.name)
    if cfg.checkpoint.dir is not None:
        cfg.checkpoint.dir = cfg.checkpoint.dir.replace("${name}", cfg.name)


def _validate(raw: dict[str, Any], prov: Provenance) -> tuple[RunConfig | None, list[Problem]]:
    try:
        cfg = RunConfig.model_validate(raw)
    except ValidationError as e:
        return None, problems_from_validation(e, prov)
    _substitute_name(cfg)
    return cfg, []


def analyze_config(cfg: RunConfig, prov: Provenance, base_dir: Path | None = None) -> Analysis:
    """Checks, derived quantities, model facts and fit of an already validated config."""
    problems: list[Problem] = []
    an = Analysis(cfg, prov, problems)
    try:
        an.hardware = load_hardware(cfg.resources.hardware, base_dir)
    except HardwareNotFound as e:
        problems.append(Problem("error", "hardware-unknown", str(e), "resources.hardware"))
    except HardwareInvalid as e:
        problems.append(Problem("error", "hardware-invalid", str(e), "resources.hardware"))
    an.derived = derive(cfg, dataset_train_size(cfg, base_dir))
    problems += checks.async_rules(cfg, prov)
    problems += checks.correction_rules(cfg, prov)
    problems += checks.trainer_rules(cfg, prov, an.derived)
    problems += checks.multi_turn_rules(cfg, prov, base_dir)
    problems += checks.path_rules(cfg, prov, base_dir)
    problems += data_checks.dataset_rules(cfg, base_dir)
    problems += data_checks.reward_rules(cfg)
    try:
        an.model = read_model_facts(cfg.model.path, base_dir)
    except ModelConfigError as e:
        an.model_note = str(e)
        problems.append(
            Problem(
                "info",
                "model-facts-unavailable",
                f"parameter counts and memory fit skipped: {e}",
                "model.path",
            )
        )
    if an.model is not None:
        if an.model.counted_as:
            problems.append(
                Problem(
                    "info",
                    "model-generic",
                    f"{an.model.model_type!r}: counted as a {an.model.counted_as}",
                    "model.path",
                )
            )
        problems += checks.model_rules(cfg, an.model)
        problems += checkpoint_disk_rules(cfg, an.model)
    if an.hardware is not None:
        problems += checks.resource_rules(cfg, an.hardware, an.derived)
        problems += replica_rules(cfg, an.hardware, an.derived, an.model)
        problems += perf_rules(cfg, an.hardware)
        problems += checks.pitfall_rules(cfg, an.hardware)
        problems += determinism_rules(cfg, an.hardware)
        if an.model is not None:
            an.fit = estimate_fit(cfg, an.model, an.hardware)
            problems += checks.fit_rules(an.fit, an.hardware)
    an.problems = sorted_problems(locate(problems, prov))
    return an


def analyze_run_config(
    path: str | Path, overrides: Sequence[str] = (), env: Mapping[str, str] | None = None
) -> Analysis:
    """Load `path` with `overrides` and analyse it; raises only `layering.OverrideError` (usage)."""
    raw, prov, problems = resolve_layers(path, overrides, env)
    problems = locate(problems, prov)
    if raw is None or any(p.code in _FATAL_LAYER_CODES and p.severity == "error" for p in problems):
        return Analysis(None, prov, sorted_problems(problems))
    cfg, schema_problems = _validate(raw, prov)
    problems += schema_problems
    if cfg is None:
        return Analysis(None, prov, sorted_problems(problems))
    an = analyze_config(cfg, prov, Path(path).resolve().parent)
    an.problems = sorted_problems(problems + an.problems)
    return an


def load_run_config(
    path: str | Path, overrides: Sequence[str] = (), env: Mapping[str, str] | None = None
) -> LoadResult:
    """The run config at `path` with `--set` style `overrides`: (config, provenance, problems).

    `config` is None when there is any error (of either category); warnings and notes never block.
    """
    an = analyze_run_config(path, overrides, env)
    ok = an.config is not None and exit_code_for(an.problems) == 0
    return LoadResult(an.config if ok else None, an.provenance, an.problems)
