"""Random-initialised models at real sizes, built from the config.json files the repository ships (no hub).

`MODELS` maps a short name to a shipped config; `load_spec(name, smoke)` reads it and, for the CPU smoke
run, shrinks every size field (same architecture, a few thousand parameters) so the whole check runs on a
laptop CPU. `build_model` instantiates the transformers `*ForCausalLM` directly on the target device in
the target dtype (weights ~ N(0, initializer_range²), as transformers initialises them), so a 7B model
never touches host memory.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[2]

MODELS: dict[str, Path] = {
    "qwen3-0.6b": REPO / "tests" / "config" / "fixtures" / "hf" / "qwen3-0.6b" / "config.json",
    "qwen2.5-7b": REPO / "asyncrl_cli" / "config" / "known_models" / "Qwen--Qwen2.5-Math-7B.json",
}

# The CPU smoke run keeps each architecture but shrinks it (2 layers, vocab 512; head_dim 32, the least vLLM's CPU
# attention serves).
SMOKE_SIZES: dict[str, Any] = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "max_window_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "vocab_size": 512,
    "bos_token_id": 510,
    "eos_token_id": 511,
}


@dataclass(frozen=True)
class ModelSpec:
    """A config.json as a dict plus the facts the benchmarks need."""

    name: str
    config: dict[str, Any]

    @property
    def vocab_size(self) -> int:
        return int(self.config["vocab_size"])

    @property
    def eos_id(self) -> int:
        eos = self.config.get("eos_token_id", self.vocab_size - 1)
        return int(eos[0] if isinstance(eos, list) else eos)

    @property
    def tied(self) -> bool:
        return bool(self.config.get("tie_word_embeddings", False))


def load_spec(name: str, smoke: bool = False) -> ModelSpec:
    """The shipped config of `name` (see `MODELS`), shrunk with `SMOKE_SIZES` when `smoke`."""
    config = json.loads(MODELS[name].read_text())
    if smoke:
        config.update(SMOKE_SIZES)
    return ModelSpec(name, config)


def hf_config(spec: ModelSpec) -> Any:
    """The transformers config object of `spec`."""
    from transformers import AutoConfig

    fields = {k: v for k, v in spec.config.items() if k not in ("model_type", "torch_dtype", "dtype")}
    return AutoConfig.for_model(spec.config["model_type"], **fields)


def build_model(
    spec: ModelSpec, device: torch.device | str, dtype: torch.dtype, seed: int
) -> torch.nn.Module:
    """A randomly initialised causal LM of `spec`, allocated and initialised on `device` in `dtype`."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(hf_config(spec), dtype=dtype)
    return model.eval()


def parameter_count(model: torch.nn.Module) -> int:
    """Distinct parameters (a tied embedding counts once)."""
    return sum(p.numel() for p in model.parameters())


def parameter_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def save_hf_dir(model: torch.nn.Module, path: Path) -> Path:
    """config.json + safetensors of `model` (what `MegatronTrainerBackend` loads)."""
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    return path
