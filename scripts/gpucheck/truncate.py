"""A layer-truncated copy of a Hugging Face checkpoint: the first `layers` decoder layers of the source, with
everything else (embeddings, final norm, output head, tokenizer files) unchanged, so the copy has the real
model's widths, experts and vocabulary and loads wherever the full one does (transformers, Megatron's HF import,
vLLM). The device ladder's rung 8 runs seed 000's path on such a copy of Qwen3-30B-A3B-Base.

Tensors are streamed one by one from the source's safetensors files (never the whole model in memory) into
shards of at most `shard_bytes`, with a `model.safetensors.index.json`. config.json gets `num_hidden_layers =
layers` and the per-layer lists / bounds (`mlp_only_layers`, `max_window_layers`, `layer_types`) cut to match.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

_LAYER = re.compile(r"(^|\.)layers\.(\d+)\.")
_SKIP = {"config.json", "model.safetensors.index.json"}


def truncated_config(config: dict[str, Any], layers: int) -> dict[str, Any]:
    """`config` (a config.json dict) with `layers` decoder layers."""
    if not 0 < layers <= int(config["num_hidden_layers"]):
        raise ValueError(f"layers = {layers}: the model has {config['num_hidden_layers']}")
    out = dict(config, num_hidden_layers=layers)
    if "max_window_layers" in out:
        out["max_window_layers"] = min(int(out["max_window_layers"]), layers)
    if out.get("mlp_only_layers"):
        out["mlp_only_layers"] = [i for i in out["mlp_only_layers"] if i < layers]
    if isinstance(out.get("layer_types"), list):
        out["layer_types"] = out["layer_types"][:layers]
    return out


def keep(name: str, layers: int) -> bool:
    """Whether tensor `name` belongs to the truncated model (not a decoder layer ≥ `layers`)."""
    m = _LAYER.search(name)
    return m is None or int(m.group(2)) < layers


def truncate_checkpoint(src: Path, dst: Path, layers: int, shard_bytes: int = 4 << 30) -> dict[str, Any]:
    """Write the `layers`-layer copy of checkpoint directory `src` to `dst`; returns what was written."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    src, dst = Path(src), Path(dst)
    files = sorted(src.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{src}: no *.safetensors files (a Hugging Face checkpoint directory is needed)")
    dst.mkdir(parents=True, exist_ok=True)
    config = truncated_config(json.loads((src / "config.json").read_text()), layers)
    (dst / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for f in src.iterdir():  # tokenizer, generation config, chat template, processor files
        if f.is_file() and f.name not in _SKIP and not f.name.endswith(".safetensors"):
            shutil.copy2(f, dst / f.name)
    weight_map: dict[str, str] = {}
    shard: dict[str, Any] = {}
    size, count, total = 0, 0, 0

    def flush() -> None:
        nonlocal shard, size, count
        if shard:
            count += 1
            name = f"model-{count:05d}.safetensors"
            save_file(shard, str(dst / name), metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(shard, name))
            shard, size = {}, 0

    for f in files:
        with safe_open(str(f), framework="pt") as reader:
            for name in reader.keys():  # noqa: SIM118 (safe_open has no __iter__)
                if not keep(name, layers):
                    continue
                t = reader.get_tensor(name)
                nbytes = t.numel() * t.element_size()
                if size and size + nbytes > shard_bytes:
                    flush()
                shard[name], size, total = t, size + nbytes, total + nbytes
    flush()
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (dst / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return {"path": str(dst), "layers": layers, "tensors": len(weight_map), "bytes": total, "shards": count}
