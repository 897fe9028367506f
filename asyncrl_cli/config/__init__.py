"""Run configuration: schema, TOML layering with provenance, presets, model facts and fit checks.

Importable without torch, ray, vllm or transformers. The engine calls `load_run_config`.
"""

from asyncrl_cli.config.loader import Analysis, LoadResult, analyze_run_config, load_run_config
from asyncrl_cli.config.problems import Problem
from asyncrl_cli.config.provenance import Origin, Provenance
from asyncrl_cli.config.schema import RunConfig

__all__ = [
    "Analysis",
    "LoadResult",
    "Origin",
    "Problem",
    "Provenance",
    "RunConfig",
    "analyze_run_config",
    "load_run_config",
]
