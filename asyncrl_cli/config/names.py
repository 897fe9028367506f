"""The closed vocabularies of the config (built-in models and datasets, named rewards, metric sinks), defined
next to the schema in `engine.config.names`; a plain module without pydantic, so CLI help text can name them
without building the schema."""

from __future__ import annotations

from engine.config.names import BUILTIN_DATASETS, BUILTIN_MODELS, NAMED_REWARDS, SINKS

__all__ = ["BUILTIN_DATASETS", "BUILTIN_MODELS", "NAMED_REWARDS", "SINKS"]
