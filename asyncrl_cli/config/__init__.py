"""Run configuration: schema, TOML layering with provenance, presets, model facts and fit checks.

Importable without torch, ray, vllm or transformers. The schema the layers are validated into is the engine's
(`engine.config.schema`, imported from there: this package re-exports no engine module).

The names below load on first use (PEP 562), so a light submodule such as `config.problems` or
`config.catalog` can be imported without building the pydantic schema — `asyncrl --help` stays instant.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from asyncrl_cli.config.loader import Analysis, LoadResult, analyze_run_config, load_run_config  # noqa: F401
    from asyncrl_cli.config.problems import Problem  # noqa: F401
    from asyncrl_cli.config.provenance import Origin, Provenance  # noqa: F401

_HOME = {
    "Analysis": "loader",
    "LoadResult": "loader",
    "analyze_run_config": "loader",
    "load_run_config": "loader",
    "Problem": "problems",
    "Origin": "provenance",
    "Provenance": "provenance",
}

__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
