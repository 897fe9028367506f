"""The run-config schema, for the CLI: the pydantic models live in the engine (`engine.config.schema`, which
the engine runs on and the CLI validates with); this module keeps the CLI's import path for them.

The engine cannot import `asyncrl_cli`, so the one definition sits on the engine side of the boundary (see
docs/architecture.md, "The boundary"). Importable without torch, ray, vllm or transformers.
"""

from __future__ import annotations

from engine.config.schema import (
    SCHEMA_VERSION,
    AlgorithmConfig,
    AsyncTrainingConfig,
    CheckpointConfig,
    DataConfig,
    DebugConfig,
    LoggingConfig,
    ModelConfig,
    NodeGroup,
    OptimConfig,
    ResourcesConfig,
    RolloutConfig,
    RolloutCorrectionConfig,
    RunConfig,
    Section,
    TrainerConfig,
)

__all__ = [
    "SCHEMA_VERSION", "AlgorithmConfig", "AsyncTrainingConfig", "CheckpointConfig", "DataConfig", "DebugConfig",
    "LoggingConfig", "ModelConfig", "NodeGroup", "OptimConfig", "ResourcesConfig", "RolloutConfig",
    "RolloutCorrectionConfig", "RunConfig", "Section", "TrainerConfig",
]  # fmt: skip
