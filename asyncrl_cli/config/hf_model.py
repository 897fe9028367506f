"""Model facts from a Hugging Face `config.json`, read offline (no weights, no transformers).

Parameter counts are computed from the architecture, per decoder layer (H = hidden, I = intermediate,
n_h/n_kv = attention/KV heads, d = head_dim, V = vocab, E = experts, k = experts per token):

- attention: H·n_h·d (q) + 2·H·n_kv·d (k, v) + n_h·d·H (o), plus biases (q/k/v for Qwen2, all four with
  `attention_bias`), plus q/k RMSNorm weights (2·d) for Qwen3;
- dense gated MLP: 3·H·I; MoE layer: E·3·H·I_moe + router H·E (+ a shared expert 3·H·I_s + H for Qwen2-MoE);
- two RMSNorms 2·H per layer, a final norm H, embeddings V·H, and an LM head V·H unless tied.
- active parameters replace E experts by k experts.
- Qwen3-VL's vision tower: Conv3d patch embedding (C·T·P²·h + h), learned position embeddings (N·h),
  `depth` ViT blocks (two LayerNorms 4h, qkv 3h² + 3h, proj h² + h, MLP 2·h·i + i + h), the patch merger
  (LayerNorm over h, then (4h)² + 4h and 4h·out + out for spatial merge 2), and one deepstack merger per
  deepstack index (LayerNorm over 4h). The vision tower counts as active.

Where the config comes from: a local directory (or file), the Hugging Face cache (`$HF_HUB_CACHE`,
`$HF_HOME/hub`, `~/.cache/huggingface/hub`), or a config shipped with asyncrl for the models of the
presets (`known_models/`).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

KNOWN_DIR = Path(__file__).with_name("known_models")

DENSE_FAMILIES = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}
MOE_FAMILIES = {"qwen3_moe", "qwen2_moe", "mixtral"}
VL_FAMILIES = {"qwen3_vl", "qwen3_vl_moe"}


class ModelConfigError(ValueError):
    """config.json is missing, unreadable, or describes an architecture we cannot count."""


@dataclass(frozen=True)
class ModelFacts:
    """What the planner and the fit estimate need to know about a model."""

    family: str
    model_type: str
    params_total: int
    params_active: int
    params_vision: int
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    experts: int
    experts_per_token: int
    moe_intermediate: int
    tied: bool
    max_position_embeddings: int | None
    dtype: str | None
    source: str
    """Where config.json was read: a path, or `known:<id>` for a config shipped with asyncrl."""
    counted_as: str | None = None
    """Set when the architecture is unknown and was counted as a generic dense decoder."""
    moe_layers: int = 0
    """Layers with routed experts (all unless `mlp_only_layers`/`decoder_sparse_step` say otherwise)."""

    @property
    def is_moe(self) -> bool:
        """True for mixture-of-experts models."""
        return self.experts > 1

    @property
    def params_expert(self) -> int:
        """Parameters inside routed experts (0 for dense models)."""
        if not self.is_moe:
            return 0
        return self.moe_layers * self.experts * 3 * self.hidden * self.moe_intermediate

    def kv_bytes_per_token(self, dtype_bytes: int, tp: int = 1) -> int:
        """KV-cache bytes per token on one GPU: 2 (K and V) · layers · ⌈n_kv / tp⌉ · d · bytes."""
        kv_per_gpu = max(1, -(-self.kv_heads // tp))
        return 2 * self.layers * kv_per_gpu * self.head_dim * dtype_bytes

    def to_json(self) -> dict[str, Any]:
        """A plain dict for `--json` output."""
        d = asdict(self)
        d["is_moe"] = self.is_moe
        d["params_expert"] = self.params_expert
        return d


def hub_cache_dirs() -> list[Path]:
    """Candidate Hugging Face hub cache directories, most specific first."""
    dirs: list[Path] = []
    if os.environ.get("HF_HUB_CACHE"):
        dirs.append(Path(os.environ["HF_HUB_CACHE"]))
    if os.environ.get("HF_HOME"):
        dirs.append(Path(os.environ["HF_HOME"]) / "hub")
    dirs.append(Path.home() / ".cache" / "huggingface" / "hub")
    return dirs


def _known_id(model: str) -> str:
    return model.replace("/", "--").replace(":", "--")


def _cached_config(model: str) -> Path | None:
    """config.json of hub id `model` in a local Hugging Face cache (refs/main first), or None."""
    for cache in hub_cache_dirs():
        repo = cache / f"models--{model.replace('/', '--')}"
        snaps = repo / "snapshots"
        ref = repo / "refs" / "main"
        if ref.is_file() and (snaps / ref.read_text().strip() / "config.json").is_file():
            return snaps / ref.read_text().strip() / "config.json"
        if snaps.is_dir():
            for snap in sorted(snaps.iterdir()):
                if (snap / "config.json").is_file():
                    return snap / "config.json"
    return None


def in_hub_cache(model: str) -> bool:
    """True when hub id `model` has a snapshot in a local Hugging Face cache."""
    return model.count("/") == 1 and _cached_config(model) is not None


def find_config_json(model: str, base_dir: Path | None = None) -> Path | None:
    """Locate config.json for a local dir/file, a cached hub id, or a known model; None if none."""
    candidates: list[Path] = []
    p = Path(os.path.expanduser(model))
    candidates.append(p)
    if base_dir is not None and not p.is_absolute():
        candidates.append(base_dir / p)
    for c in candidates:
        if c.is_file() and c.name.endswith(".json"):
            return c
        if (c / "config.json").is_file():
            return c / "config.json"
    if model.count("/") == 1 and not model.startswith((".", "/", "~")):
        cached = _cached_config(model)
        if cached is not None:
            return cached
    known = KNOWN_DIR / f"{_known_id(model)}.json"
    if known.is_file():
        return known
    base = model.rstrip("/").split("/")[-1]
    for f in KNOWN_DIR.glob("*.json"):  # a local dir named like a known model, e.g. .../Qwen3-30B-A3B-Base
        if f.stem.split("--")[-1] == base and not p.exists():
            return f
    return None


def read_model_facts(model: str, base_dir: Path | None = None) -> ModelFacts:
    """Facts of `model` (path, hub id or `builtin:NAME`); raises ModelConfigError when unavailable."""
    path = find_config_json(model, base_dir)
    if path is None and model.startswith("builtin:"):
        raise ModelConfigError(f"{model} is built in process by the engine (no config.json)")
    if path is None:
        raise ModelConfigError(
            f"no config.json for {model!r}: not a local directory, not in the Hugging Face cache, "
            "and not one of the models asyncrl knows"
        )
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise ModelConfigError(f"cannot read {path}: {e}") from None
    source = f"known:{path.stem.replace('--', '/')}" if path.parent == KNOWN_DIR else str(path)
    return facts_from_config(cfg, source)


def _get(cfg: dict[str, Any], key: str, default: Any = None) -> Any:
    v = cfg.get(key, default)
    return default if v is None else v


def _attention(cfg: dict[str, Any], family: str) -> tuple[int, int, int, int, int]:
    """(params per layer of attention incl. norms, hidden, heads, kv_heads, head_dim)."""
    h = int(cfg["hidden_size"])
    nh = int(cfg["num_attention_heads"])
    nkv = int(_get(cfg, "num_key_value_heads", nh))
    d = int(_get(cfg, "head_dim", h // nh))
    q, kv = nh * d, nkv * d
    params = h * q + 2 * h * kv + q * h
    if family in ("qwen2", "qwen2_moe"):
        params += q + 2 * kv  # qkv bias, no o bias
    elif _get(cfg, "attention_bias", False):
        params += q + 2 * kv + h
    if family in ("qwen3", "qwen3_moe", "qwen3_vl", "qwen3_vl_moe"):
        params += 2 * d  # q_norm, k_norm
    params += 2 * h  # input and post-attention RMSNorm
    return params, h, nh, nkv, d


def _vision_params(v: dict[str, Any]) -> int:
    """Qwen3-VL vision tower (see the module docstring)."""
    h, i, depth = int(v["hidden_size"]), int(v["intermediate_size"]), int(v["depth"])
    c, t, p = int(_get(v, "in_channels", 3)), int(_get(v, "temporal_patch_size", 2)), int(v["patch_size"])
    merge = int(_get(v, "spatial_merge_size", 2))
    out = int(v["out_hidden_size"])
    patch = c * t * p * p * h + h
    pos = int(_get(v, "num_position_embeddings", 0)) * h
    block = 4 * h + (3 * h * h + 3 * h) + (h * h + h) + (2 * h * i + i + h)
    hm = h * merge * merge

    def merger(norm_dim: int) -> int:
        return 2 * norm_dim + hm * hm + hm + hm * out + out

    deepstack = len(_get(v, "deepstack_visual_indexes", []))
    return patch + pos + depth * block + merger(h) + deepstack * merger(hm)


def facts_from_config(cfg: dict[str, Any], source: str = "<dict>") -> ModelFacts:
    """Count parameters and collect the shape facts of a parsed config.json."""
    model_type = str(cfg.get("model_type", ""))
    vision = 0
    text = cfg
    if model_type in VL_FAMILIES:
        text = dict(cfg.get("text_config") or {})
        vision = _vision_params(cfg["vision_config"])
    family = model_type
    counted_as = None
    if family not in DENSE_FAMILIES and family not in MOE_FAMILIES and family not in VL_FAMILIES:
        if not {"hidden_size", "num_attention_heads", "num_hidden_layers", "vocab_size"} <= cfg.keys():
            raise ModelConfigError(f"{source}: model_type {model_type!r} is not a decoder config we can read")
        counted_as = "dense decoder (generic estimate)"
        family = "llama"
    fam_for_attn = DENSE_FAMILIES.get(family, family)
    try:
        attn, h, nh, nkv, d = _attention(text, fam_for_attn)
        layers = int(text["num_hidden_layers"])
        vocab = int(text["vocab_size"])
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:
        raise ModelConfigError(f"{source}: missing or bad field {e}") from None
    inter = int(_get(text, "intermediate_size", 0))
    tied = bool(_get(cfg, "tie_word_embeddings", _get(text, "tie_word_embeddings", False)))
    experts = int(_get(text, "num_experts", _get(text, "num_local_experts", 0)) or 0)
    topk = int(_get(text, "num_experts_per_tok", 0) or 0)
    moe_i = int(_get(text, "moe_intermediate_size", inter if family == "mixtral" else 0) or 0)
    dense_mlp = 3 * h * inter
    total = active = 0
    moe_layers = 0
    if experts > 1:
        sparse_step = int(_get(text, "decoder_sparse_step", 1) or 1)
        mlp_only = set(_get(text, "mlp_only_layers", []))
        shared_i = int(_get(text, "shared_expert_intermediate_size", 0) or 0)
        shared = 3 * h * shared_i + h if shared_i else 0
        for layer in range(layers):
            if layer in mlp_only or (layer + 1) % sparse_step != 0:
                total += attn + dense_mlp
                active += attn + dense_mlp
                continue
            moe_layers += 1
            router = h * experts
            total += attn + experts * 3 * h * moe_i + router + shared
            active += attn + topk * 3 * h * moe_i + router + shared
    else:
        total = active = layers * (attn + dense_mlp)
    embed = vocab * h * (1 if tied else 2) + h  # embeddings (+ LM head) + final norm
    total += embed + vision
    active += embed + vision
    return ModelFacts(
        family=model_type if counted_as is None else "unknown",
        model_type=model_type,
        params_total=total,
        params_active=active,
        params_vision=vision,
        layers=layers,
        hidden=h,
        heads=nh,
        kv_heads=nkv,
        head_dim=d,
        intermediate=inter,
        vocab=vocab,
        experts=experts if experts > 1 else 0,
        experts_per_token=topk if experts > 1 else 0,
        moe_intermediate=moe_i if experts > 1 else 0,
        tied=tied,
        max_position_embeddings=_get(text, "max_position_embeddings"),
        dtype=_get(text, "torch_dtype", _get(text, "dtype", _get(cfg, "torch_dtype"))),
        source=source,
        counted_as=counted_as,
        moe_layers=moe_layers,
    )
