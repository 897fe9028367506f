"""The run-config schema, for the CLI: the pydantic models live in the engine (`engine.config.schema`, which
the engine runs on and the CLI validates with); this module keeps the CLI's import path for every name of
that module's `__all__` (`RunConfig`, its sections, `SCHEMA_VERSION`).

The engine cannot import `asyncrl_cli`, so the one definition sits on the engine side of the boundary (see
docs/architecture.md, "The boundary"). Importable without torch, ray, vllm or transformers.
"""

from __future__ import annotations

from engine.config import schema as _schema
from engine.config.schema import *  # noqa: F403 — re-exported: the CLI's name for the engine's schema

__all__ = list(_schema.__all__)
