"""Model facts from a Hugging Face `config.json`, read offline (no weights, no transformers).

Parameter counts are computed from the architecture, per decoder layer, by what the config declares rather
than by family name (H = hidden, I = intermediate, n_h/n_kv = attention/KV heads, d = head_dim, V = vocab):

- attention, GQA/MHA: H·n_h·d (q) + 2·H·n_kv·d (k, v) + n_h·d·H (o), plus biases (q/k/v for the Qwen2
  families, q/k/v/o with `attention_bias`), q/k RMSNorms (2·d for Qwen3 and `use_qk_norm`, (n_h + n_kv)·d for
  OLMoE), and gpt-oss's attention sinks (n_h);
- attention, MLA (DeepSeek-V2/V3, Kimi-K2: `kv_lora_rank` set), with r_q = `q_lora_rank`, r_kv = `kv_lora_rank`,
  d_n/d_r/d_v = `qk_nope_head_dim`/`qk_rope_head_dim`/`v_head_dim`: q = H·r_q + r_q + r_q·n_h·(d_n + d_r)
  (or H·n_h·(d_n + d_r) without `q_lora_rank`), kv = H·(r_kv + d_r) + r_kv + r_kv·n_h·(d_n + d_v),
  o = n_h·d_v·H; its KV cache holds r_kv + d_r values per token and layer;
- MLP: a dense gated MLP 3·H·I; a MoE layer E routed experts of 3·H·I_e (I_e = `moe_intermediate_size`, else
  I; gpt-oss adds expert biases 2·I_e + H), a router H·E, and shared experts (`n_shared_experts`·3·H·I_e, or
  Qwen2-MoE's 3·H·`shared_expert_intermediate_size` + its gate H). E = `n_routed_experts` / `num_experts` /
  `num_local_experts`, k = `num_experts_per_tok` / `experts_per_token`. Layer i is MoE when
  i ≥ `first_k_dense_replace`, i mod `moe_layer_freq` = 0, (i + 1) mod `decoder_sparse_step` = 0 and i is not in
  `mlp_only_layers`; the others are dense;
- two RMSNorms 2·H per layer (four for Gemma-2/3), a final norm H, embeddings V·H, and an LM head V·H unless
  tied (`tie_word_embeddings`, whose default is True for the Gemma families and False otherwise).
  Multi-token-prediction layers (`num_nextn_predict_layers`) are not counted, as published totals do not.
- active parameters replace E experts by k experts.
- vision towers (the vision tower counts as active), h = vision hidden, i = its MLP width, P = patch, C·T the
  channels × temporal patch: Qwen3-VL: Conv3d patch embedding (C·T·P²·h + h), learned position embeddings
  (N·h), `depth` ViT blocks (two LayerNorms 4h, qkv 3h² + 3h, proj h² + h, MLP 2·h·i + i + h), the patch
  merger (LayerNorm over h, then (4h)² + 4h and 4h·out + out for spatial merge 2), and one deepstack merger per
  deepstack index (LayerNorm over 4h). Qwen2.5-VL: patch C·T·P²·h, blocks of two RMSNorms 2h, qkv and proj as
  above and a gated MLP 3·h·i + 2i + h, merger RMSNorm h + (4h)² + 4h + 4h·out + out. Qwen2-VL: h =
  `embed_dim`, i = `mlp_ratio`·h, LayerNorm blocks with a plain MLP 2·h·i + i + h, the same merger with a
  LayerNorm (2h).

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

VL_FAMILIES = {"qwen3_vl", "qwen3_vl_moe", "qwen2_5_vl", "qwen2_vl"}
TIED_BY_DEFAULT = {"gemma", "gemma2", "gemma3", "gemma3_text"}
"""Families whose config class defaults `tie_word_embeddings` to True (their config.json may omit it)."""
FOUR_NORMS = {"gemma2", "gemma3", "gemma3_text"}
QKV_BIAS = {"qwen2", "qwen2_moe", "qwen2_vl", "qwen2_5_vl"}
QK_NORM = {"qwen3", "qwen3_moe", "qwen3_vl", "qwen3_vl_moe"}
KNOWN_TYPES = {"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "deepseek_v2", "deepseek_v3",
               "kimi_k2", "gpt_oss", "glm4_moe", "olmoe", "gemma", "gemma2", "gemma3_text", *VL_FAMILIES}
"""Families whose config keys this module reads completely (checked against published totals in the tests)."""
DECODER_KEYS = {"hidden_size", "num_attention_heads", "num_hidden_layers", "vocab_size"}


class ModelConfigError(ValueError):
    """config.json is missing, unreadable, or describes an architecture we cannot count."""


@dataclass(frozen=True)
class ModelFacts:
    """What `init`'s choices and the fit estimate need to know about a model."""

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
    """Layers with routed experts (all unless `first_k_dense_replace`, `moe_layer_freq`, `mlp_only_layers` or
    `decoder_sparse_step` say otherwise)."""
    mla_kv_dim: int = 0
    """MLA only: values the KV cache holds per token and layer (r_kv + d_r, the same on every TP rank)."""
    shared_experts_params: int = 0
    """Parameters of the shared experts over all MoE layers (in the dense part: every token uses them)."""

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
        """KV-cache bytes per token on one GPU: 2 (K and V) · layers · ⌈n_kv / tp⌉ · d · bytes (MLA: layers ·
        (r_kv + d_r) · bytes, replicated on every TP rank)."""
        if self.mla_kv_dim:
            return self.layers * self.mla_kv_dim * dtype_bytes
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


def _attention(cfg: dict[str, Any], model_type: str) -> tuple[int, int, int, int, int, int]:
    """(params per layer of attention incl. the layer's norms, hidden, heads, kv_heads, head_dim, MLA KV dim)."""
    h = int(cfg["hidden_size"])
    nh = int(cfg["num_attention_heads"])
    norms = (4 if model_type in FOUR_NORMS else 2) * h  # input and post-attention RMSNorm (Gemma: pre/post both)
    if _get(cfg, "kv_lora_rank", 0):  # MLA
        r_q, r_kv = int(_get(cfg, "q_lora_rank", 0)), int(cfg["kv_lora_rank"])
        dn, dr, dv = int(cfg["qk_nope_head_dim"]), int(cfg["qk_rope_head_dim"]), int(cfg["v_head_dim"])
        q = h * r_q + r_q + r_q * nh * (dn + dr) if r_q else h * nh * (dn + dr)
        kv = h * (r_kv + dr) + r_kv + r_kv * nh * (dn + dv)
        return q + kv + nh * dv * h + norms, h, nh, nh, dn + dr, r_kv + dr
    nkv = int(_get(cfg, "num_key_value_heads", nh))
    d = int(_get(cfg, "head_dim", h // nh))
    q, kv = nh * d, nkv * d
    params = h * q + 2 * h * kv + q * h
    if model_type in QKV_BIAS:
        params += q + 2 * kv  # qkv bias, no o bias
    elif _get(cfg, "attention_bias", False):
        params += q + 2 * kv + h
    if model_type in QK_NORM or _get(cfg, "use_qk_norm", False):
        params += 2 * d  # q_norm, k_norm per head
    elif model_type == "olmoe":
        params += q + kv  # q_norm, k_norm over the whole projection
    if model_type == "gpt_oss":
        params += nh  # attention sinks
    return params + norms, h, nh, nkv, d, 0


def _qwen3_vision(v: dict[str, Any]) -> int:
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


def _qwen2_vision(v: dict[str, Any], gated: bool, out: int) -> int:
    """Qwen2-VL (plain MLP, LayerNorm) and Qwen2.5-VL (gated MLP, RMSNorm) vision towers (module docstring)."""
    h = int(_get(v, "hidden_size" if gated else "embed_dim", 0) or v["embed_dim"])
    i = int(v["intermediate_size"]) if gated else int(h * float(_get(v, "mlp_ratio", 4)))
    depth, p = int(v["depth"]), int(_get(v, "patch_size", _get(v, "spatial_patch_size", 14)))
    c, t = int(_get(v, "in_chans", _get(v, "in_channels", 3))), int(_get(v, "temporal_patch_size", 2))
    hm = h * int(_get(v, "spatial_merge_size", 2)) ** 2
    out = int(_get(v, "out_hidden_size", out))
    mlp = 3 * h * i + 2 * i + h if gated else 2 * h * i + i + h
    block = (2 if gated else 4) * h + 3 * h * h + 3 * h + h * h + h + mlp
    merger = (1 if gated else 2) * h + hm * hm + hm + hm * out + out
    return c * t * p * p * h + depth * block + merger


def _vision_params(cfg: dict[str, Any], model_type: str, text_hidden: int) -> int:
    v = cfg["vision_config"]
    if model_type.startswith("qwen3_vl"):
        return _qwen3_vision(v)
    return _qwen2_vision(v, gated=model_type == "qwen2_5_vl", out=text_hidden)


def _moe_layer(i: int, cfg: dict[str, Any]) -> bool:
    """Whether decoder layer i has routed experts (DeepSeek's and Qwen's placement keys; see the docstring)."""
    return (i >= int(_get(cfg, "first_k_dense_replace", 0)) and i % int(_get(cfg, "moe_layer_freq", 1) or 1) == 0
            and (i + 1) % int(_get(cfg, "decoder_sparse_step", 1) or 1) == 0
            and i not in set(_get(cfg, "mlp_only_layers", [])))


def facts_from_config(cfg: dict[str, Any], source: str = "<dict>") -> ModelFacts:
    """Count parameters and collect the shape facts of a parsed config.json."""
    model_type = str(cfg.get("model_type", ""))
    text = dict(cfg.get("text_config") or cfg) if model_type in VL_FAMILIES else cfg
    if not DECODER_KEYS <= text.keys():
        raise ModelConfigError(f"{source}: model_type {model_type!r} is not a decoder config we can read "
                               f"(it lacks {', '.join(sorted(DECODER_KEYS - text.keys()))})")
    try:
        attn, h, nh, nkv, d, mla = _attention(text, model_type)
        layers = int(text["num_hidden_layers"])
        vocab = int(text["vocab_size"])
        vision = _vision_params(cfg, model_type, h) if model_type in VL_FAMILIES else 0
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:
        raise ModelConfigError(f"{source}: missing or bad field {e}") from None
    counted_as = None
    if "vision_config" in cfg and model_type not in VL_FAMILIES:
        counted_as = "text decoder (its vision tower is not counted)"
    elif model_type not in KNOWN_TYPES:
        counted_as = "decoder from its config keys (an unverified family: an estimate)"
    inter = int(_get(text, "intermediate_size", 0))
    tie_default = model_type in TIED_BY_DEFAULT
    tied = bool(_get(text, "tie_word_embeddings", _get(cfg, "tie_word_embeddings", tie_default)))
    experts = int(_get(text, "n_routed_experts", _get(text, "num_experts", _get(text, "num_local_experts", 0))) or 0)
    topk = int(_get(text, "num_experts_per_tok", _get(text, "experts_per_token", 0)) or 0)
    moe_i = int(_get(text, "moe_intermediate_size", inter) or inter)
    dense_mlp = 3 * h * inter
    total = active = moe_layers = shared_total = 0
    if experts > 1:
        expert = 3 * h * moe_i + (2 * moe_i + h if model_type == "gpt_oss" else 0)
        router = h * experts + (experts if model_type == "gpt_oss" else 0)
        shared_i = int(_get(text, "shared_expert_intermediate_size", 0) or 0)
        shared = (3 * h * shared_i + h if shared_i else 0) + int(_get(text, "n_shared_experts", 0) or 0) * 3 * h * moe_i
        for layer in range(layers):
            if not _moe_layer(layer, text):
                total += attn + dense_mlp
                active += attn + dense_mlp
                continue
            moe_layers += 1
            shared_total += shared
            total += attn + experts * expert + router + shared
            active += attn + topk * expert + router + shared
    else:
        total = active = layers * (attn + dense_mlp)
    embed = vocab * h * (1 if tied else 2) + h  # embeddings (+ LM head) + final norm
    total += embed + vision
    active += embed + vision
    return ModelFacts(
        family=model_type,
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
        mla_kv_dim=mla,
        shared_experts_params=shared_total,
    )
