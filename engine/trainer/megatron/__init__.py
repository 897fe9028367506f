"""Megatron-core trainer backend (`trainer.backend = "megatron"`).

Modules: `hf_config` (HF config.json → ArchSpec), `model` (GPTModel from an ArchSpec), `convert` (HF ⇄
Megatron tensors, TP/EP sharding), `export` (gathered HF-named weights for sync), `inputs` (TrainBatch →
Megatron inputs), `vocab_parallel` (log-probs/entropy on vocab-parallel logits), `optim`, `snapshot`
(proximal policy), `checkpointing`, `parallel` (process groups), `shims` (the only CPU patches), and
`backend` (`MegatronTrainerBackend`). megatron-core itself is imported lazily, when a backend is built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.trainer.megatron.backend import MegatronTrainerBackend

__all__ = ["MegatronTrainerBackend"]


def __getattr__(name: str) -> Any:
    if name == "MegatronTrainerBackend":
        from engine.trainer.megatron.backend import MegatronTrainerBackend

        return MegatronTrainerBackend
    raise AttributeError(name)
