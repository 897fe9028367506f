"""A vision-language model's image conventions: its vision token ids (`VisionSpec`), its image processor
(`load_image_processor`), and the processor's output per image (`ImageEncoder`).

Qwen-VL image inputs: the processor resizes an image to h × w pixels, both multiples of p·m (patch size p,
spatial merge m, `smart_resize`), and cuts it into a grid (t, h/p, w/p) of patches (t = 1 for an image) —
`pixel_values` [t·(h/p)·(w/p), C·T·p²] and `image_grid_thw` [1, 3]. The language model sees

    tokens(image) = t · (h/p) · (w/p) / m²

vision tokens, each replacing one `<|image_pad|>` of the prompt. Images are processed independently, so the
inputs of several images are the row-wise concatenation of each image's.

The image processor is loaded with the PIL backend (`backend="pil"`, or `use_fast=False` on older
transformers): the torchvision one needs a torchvision build that matches torch, which the CPU wheels lack.
"""

from __future__ import annotations

import functools
import json
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.multimodal.images import open_b64

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig

    HFConfig = PretrainedConfig | dict[str, Any] | None
    """An HF model config: the object, or config.json as a dict (None: a model without one)."""

VL_MODEL_TYPES: frozenset[str] = frozenset({"qwen3_vl", "qwen3_vl_moe"})
"""Architectures whose image path is implemented and tested (Qwen3-VL dense and MoE share it)."""


@dataclass(frozen=True)
class VisionSpec:
    """The vision special tokens and merge size of a Qwen-VL model (from its config)."""

    model_type: str
    image_token_id: int
    vision_start_token_id: int
    vision_end_token_id: int
    merge_size: int

    @staticmethod
    def from_config(config: HFConfig) -> VisionSpec | None:
        """The spec of an HF config (object or config.json dict), or None for a text-only model."""
        get = config.get if isinstance(config, dict) else lambda k, d=None: getattr(config, k, d)
        model_type = str(get("model_type", "") or "")
        if model_type not in VL_MODEL_TYPES:
            return None
        vision = get("vision_config") or {}
        merge = vision.get("spatial_merge_size", 2) if isinstance(vision, dict) else vision.spatial_merge_size
        return VisionSpec(model_type, int(get("image_token_id")), int(get("vision_start_token_id")),
                          int(get("vision_end_token_id")), int(merge))

    @staticmethod
    def from_model_dir(model_dir: str | Path) -> VisionSpec | None:
        """The spec read from `model_dir/config.json`, or None (no config, or a text-only model)."""
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            return None
        return VisionSpec.from_config(json.loads(path.read_text()))

    def tokens_for_grid(self, grid_thw: Sequence[int]) -> int:
        """Vision tokens of one image: t · h · w / m² for its patch grid (t, h, w)."""
        t, h, w = (int(x) for x in grid_thw)
        return t * h * w // (self.merge_size**2)


def placeholder_token_ids(config: HFConfig) -> list[int]:
    """The image and video placeholder ids of a VL config: input-only tokens, never sampled (see
    `suppress_tokens`); [] for a text-only model."""
    if VisionSpec.from_config(config) is None:
        return []
    get = config.get if isinstance(config, dict) else lambda k, d=None: getattr(config, k, d)
    return sorted({int(v) for v in (get("image_token_id"), get("video_token_id")) if v is not None})


def suppress_tokens(logits: torch.Tensor, token_ids: Sequence[int]) -> torch.Tensor:
    """`logits` [..., V] with the given token ids set to −∞ (a copy; the input is untouched):
    the distribution π(v) ∝ exp(z_v) · 1[v ∉ token_ids]."""
    if not token_ids:
        return logits
    out = logits.clone()
    out[..., list(token_ids)] = float("-inf")
    return out


def model_dir_of(model: torch.nn.Module) -> str | None:
    """The directory a transformers model was loaded from (`name_or_path`), if it is a local directory."""
    path = getattr(model, "name_or_path", None) or getattr(getattr(model, "config", None), "_name_or_path", None)
    return str(path) if path and Path(str(path)).is_dir() else None


@functools.lru_cache(maxsize=8)
def load_image_processor(model_dir: str) -> Any:
    """The model's image processor (PIL backend), offline. ValueError when the directory has none."""
    from transformers import AutoImageProcessor

    if not (Path(model_dir) / "preprocessor_config.json").is_file():
        raise ValueError(f"{model_dir}: no preprocessor_config.json, so the model has no image processor "
                         "(is it a vision-language model?)")
    try:
        return AutoImageProcessor.from_pretrained(model_dir, local_files_only=True, backend="pil")
    except (TypeError, ValueError):  # transformers without `backend=`: use_fast=False is the PIL one
        return AutoImageProcessor.from_pretrained(model_dir, local_files_only=True, use_fast=False)


def processor_chat_template(model_dir: str) -> str | None:
    """The processor's chat template of a model directory (`chat_template.jinja`, or the `chat_template` of
    `chat_template.json`), for tokenizers saved without one; None if there is none."""
    root = Path(model_dir)
    jinja = root / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    as_json = root / "chat_template.json"
    if as_json.is_file():
        template = json.loads(as_json.read_text()).get("chat_template")
        return str(template) if template else None
    return None


class _LRU:
    """A small thread-safe LRU map (replicas generate while their control thread runs)."""

    def __init__(self, size: int) -> None:
        self.size = int(size)
        self._items: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> Any:
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def put(self, key: str, value: Any) -> None:
        with self._lock:
            self._items[key] = value
            while len(self._items) > self.size:
                self._items.popitem(last=False)


class ImageEncoder:
    """`pixel_values` and grid of encoded images under one image processor, cached per image (LRU of
    `cache_size` images' pixels, and of many more token counts)."""

    def __init__(self, processor: Any, spec: VisionSpec, cache_size: int = 64) -> None:
        self.processor = processor
        self.spec = spec
        self._pixels = _LRU(cache_size)
        self._tokens = _LRU(64 * cache_size)
        self.processed = 0

    @staticmethod
    def for_model_dir(model_dir: str) -> ImageEncoder:
        spec = VisionSpec.from_model_dir(model_dir)
        if spec is None:
            raise ValueError(f"{model_dir}: not a vision-language model (model_type not in "
                             f"{', '.join(sorted(VL_MODEL_TYPES))})")
        return ImageEncoder(load_image_processor(model_dir), spec)

    def tokens(self, image: str) -> int:
        """Vision tokens the language model sees for `image`: from its size alone when the processor can
        count patches (`get_number_of_image_patches`, t = 1 for an image), else from its processed grid."""
        hit = self._tokens.get(image)
        if hit is not None:
            return int(hit)
        count = getattr(self.processor, "get_number_of_image_patches", None)
        if count is None:
            tokens = self.spec.tokens_for_grid(self.features(image)[1])
        else:
            from engine.multimodal.images import image_size

            width, height = image_size(image)
            tokens = int(count(height, width, {})) // (self.spec.merge_size**2)
        self._tokens.put(image, tokens)
        return tokens

    def features(self, image: str) -> tuple[torch.Tensor, tuple[int, int, int]]:
        """(`pixel_values` [patches, C·T·p²] fp32, grid (t, h, w)) of one image."""
        import torch

        hit = self._pixels.get(image)
        if hit is not None:
            return hit
        out = self.processor(images=[open_b64(image)], return_tensors="pt")
        grid: tuple[int, int, int] = tuple(int(x) for x in out["image_grid_thw"][0].tolist())  # type: ignore[assignment]
        value = (out["pixel_values"].to(torch.float32), grid)
        self._pixels.put(image, value)
        self.processed += 1
        return value

    def batch(self, images: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(`pixel_values` [Σ patches, D], `image_grid_thw` [N, 3] long) of `images` in order; None if empty."""
        import torch

        if not images:
            return None
        feats = [self.features(img) for img in images]
        pixels = torch.cat([f[0] for f in feats])
        grid = torch.tensor([f[1] for f in feats], dtype=torch.long)
        return pixels, grid
