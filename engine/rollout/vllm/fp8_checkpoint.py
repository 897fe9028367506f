"""The block-FP8 checkpoint a vLLM replica with `rollout.quantization = "fp8"` starts from.

vLLM builds a block-FP8 model (`Fp8LinearMethod`, `weight_block_size` [128, 128]: fp8 `weight` + fp32
`weight_scale_inv` per linear layer) when the checkpoint's config.json carries DeepSeek-V3's
`quantization_config` (`engine.sync.fp8.QUANTIZATION_CONFIG`); only then do the fp8 buckets of the weight sync
fit its parameters. A released FP8 checkpoint (DeepSeek-V3, Kimi-K2) is used as it is. Any other (the bf16 /
fp32 checkpoint the trainer starts from) is written once as its block-FP8 twin: the same files, each tensor first
cast to the rollout dtype (what the trainer's export sends) and then quantised exactly as the sender quantises a
bucket (`engine.sync.fp8.quantize_bucket`), so the replica's start-up weights are those of a version-0 sync.
The config lists the linear layers left unquantised (`ignored_layers`: routers, a vision tower) so vLLM builds
them unquantised too, as the sender sends them.

The twin lives in `<tmp>/asyncrl-fp8-<hash of the source path, dtype>` and is written to a temporary name and
renamed, so replicas starting together on one host share one copy. Pure torch + safetensors (no vLLM import).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

WEIGHT_FILES = (".safetensors", ".safetensors.index.json")


def is_block_fp8(config: dict[str, Any]) -> bool:
    """Whether a config.json already describes a block-FP8 checkpoint (DeepSeek-V3's `quantization_config`)."""
    q = config.get("quantization_config") or {}
    return q.get("quant_method") == "fp8" and list(q.get("weight_block_size") or []) == [128, 128]


def fp8_checkpoint(model_dir: str | Path, dtype: str, root: str | Path | None = None) -> Path:
    """The block-FP8 checkpoint of `model_dir` (module docstring): `model_dir` itself when it is one, else its
    twin (written on first use) with the weights cast to `dtype` ("bfloat16", …) before they are quantised."""
    src = Path(model_dir).resolve()
    config = json.loads((src / "config.json").read_text())
    if is_block_fp8(config):
        return src
    key = hashlib.sha256(f"{src}|{dtype}".encode()).hexdigest()[:16]
    out = Path(root or tempfile.gettempdir()) / f"asyncrl-fp8-{key}"
    if (out / "config.json").exists():
        return out
    work = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    try:
        _write(src, work, config, dtype)
        try:
            os.rename(work, out)
        except OSError:  # another replica on this host wrote it first
            shutil.rmtree(work, ignore_errors=True)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return out


def _write(src: Path, dst: Path, config: dict[str, Any], dtype: str) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    from engine.sync.fp8 import QUANTIZATION_CONFIG, quantizable, quantize_bucket

    torch_dtype = getattr(torch, dtype)
    ignored: list[str] = []
    weight_map: dict[str, str] = {}
    for f in sorted(src.iterdir()):
        if f.name.endswith(".safetensors"):
            tensors = {k: (v.to(torch_dtype) if v.is_floating_point() else v) for k, v in load_file(f).items()}
            ignored += [k.removesuffix(".weight") for k, v in tensors.items()
                        if v.dim() == 2 and k.endswith(".weight") and not quantizable(k, v)
                        and "embed_tokens" not in k and "lm_head" not in k]
            out = {k: v.contiguous() for k, v in quantize_bucket(tensors).items()}
            save_file(out, str(dst / f.name), metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(out, f.name))
        elif not f.name.endswith(WEIGHT_FILES) and f.name != "config.json" and f.is_file():
            shutil.copy2(f, dst / f.name)
    if (src / "model.safetensors.index.json").exists():
        index = json.loads((src / "model.safetensors.index.json").read_text())
        index["weight_map"] = weight_map
        (dst / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    config = {**config, "torch_dtype": dtype,
              "quantization_config": {**QUANTIZATION_CONFIG, "ignored_layers": sorted(ignored)}}
    (dst / "config.json").write_text(json.dumps(config, indent=2))
