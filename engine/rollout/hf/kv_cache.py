"""A KV cache with preallocated storage, for the `hf` sampler's decode loop.

transformers' `DynamicLayer` appends by `torch.cat`, copying the whole cache of every layer at every
decode step (quadratic in the response length). Here each layer owns buffers of shape
[rows, kv_heads, capacity, head_dim]; a step writes one column in place and attention reads the view
[..., :length, :]. Capacity is sized by the caller (context + budget) and doubles if ever exceeded.
Dropping finished rows (`select_rows`) gathers only the live part of each buffer.

Continuous batching joins a running batch and newly prefilled rows with `merge_rows`: every row's real
columns are right-aligned at the new width (its mask is left-padded to match) and the left padding is
zero-filled, so masked positions hold finite values whatever the attention implementation.

Only full-attention layers are supported; `make_cache` falls back to transformers' `DynamicCache` for
models with sliding-window or other layer types (`supports_merge` is False: such a batch is not joined).
"""

from __future__ import annotations

from functools import partial

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer


class PreallocatedLayer(DynamicLayer):
    """One layer's keys/values in preallocated buffers; `keys`/`values` are views of the filled part."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = max(int(capacity), 1)
        self.length = 0
        self.rows = 0  # live rows: the first `rows` of the buffers (more may be allocated)
        self._key_buf: torch.Tensor | None = None
        self._value_buf: torch.Tensor | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        rows, heads, _, dim = key_states.shape
        self.device = key_states.device
        self._key_buf = key_states.new_empty((rows, heads, self.capacity, dim))
        self._value_buf = value_states.new_empty((rows, value_states.shape[1], self.capacity, value_states.shape[-1]))
        self.length, self.rows = 0, rows
        self.is_initialized = True

    def _grow(self, needed: int) -> None:
        new_capacity = max(needed, 2 * self.capacity)
        for name in ("_key_buf", "_value_buf"):
            old = getattr(self, name)
            new = old.new_empty((*old.shape[:2], new_capacity, old.shape[-1]))
            new[:, :, : self.length] = old[:, :, : self.length]
            setattr(self, name, new)
        self.capacity = new_capacity

    def _refresh_views(self) -> None:
        self.keys = self._key_buf[: self.rows, :, : self.length]
        self.values = self._value_buf[: self.rows, :, : self.length]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        new = key_states.shape[-2]
        if self.length + new > self.capacity:
            self._grow(self.length + new)
        self._key_buf[: self.rows, :, self.length : self.length + new] = key_states
        self._value_buf[: self.rows, :, self.length : self.length + new] = value_states
        self.length += new
        self._refresh_views()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length if self.is_initialized else 0

    @classmethod
    def from_buffers(cls, key_buf: torch.Tensor, value_buf: torch.Tensor, length: int, rows: int) -> PreallocatedLayer:
        layer = cls(key_buf.shape[2])
        layer._key_buf, layer._value_buf = key_buf, value_buf
        layer.length, layer.rows, layer.device, layer.is_initialized = int(length), int(rows), key_buf.device, True
        layer._refresh_views()
        return layer

    def move_rows(self, src: torch.Tensor, dst: torch.Tensor, rows: int) -> None:
        """Copy rows `src` into slots `dst` (filled columns only), then keep the first `rows` live."""
        if src.numel():
            for buf in (self._key_buf, self._value_buf):
                buf[dst, :, : self.length] = buf[src, :, : self.length]
        self.rows = int(rows)
        self._refresh_views()

    def append_rows(self, other: PreallocatedLayer) -> None:
        """Write `other`'s live rows (length ≤ ours) into the free slots after ours, right-aligned."""
        n, m, cols = self.rows, other.rows, other.length
        for buf, src in ((self._key_buf, other._key_buf), (self._value_buf, other._value_buf)):
            buf[n : n + m, :, self.length - cols : self.length] = src[:m, :, :cols]
            if cols < self.length:
                buf[n : n + m, :, : self.length - cols] = 0
        self.rows = n + m
        self._refresh_views()

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if not self.is_initialized:
            return
        for name in ("_key_buf", "_value_buf"):
            old = getattr(self, name)
            new = old.new_empty((indices.numel(), *old.shape[1:]))
            new[:, :, : self.length] = old[indices, :, : self.length]
            setattr(self, name, new)
        self.rows = int(indices.numel())
        self._refresh_views()

    def batch_repeat_interleave(self, repeats: int) -> None:
        self.batch_select_indices(torch.arange(self._key_buf.shape[0], device=self.device).repeat_interleave(repeats))

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.batch_select_indices(beam_idx)

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative count of tokens to remove")
        if self.is_initialized and tokens_to_remove < 0:
            self.length = max(self.length + tokens_to_remove, 0)
            self._refresh_views()


def _full_attention_only(config: object | None) -> bool:
    if config is None:
        return True
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    layer_types = getattr(text, "layer_types", None) or []
    return all(t == "full_attention" for t in layer_types) and not getattr(text, "use_sliding_window", False)


class GrowableKVCache(DynamicCache):
    """`DynamicCache` whose layers are `PreallocatedLayer`s of the given capacity (tokens per row)."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.layers = []
        self.layer_class_to_replicate = partial(PreallocatedLayer, capacity)

    def select_rows(self, indices: torch.Tensor) -> None:
        """Keep (or repeat) cache rows `indices`, in that order."""
        for layer in self.layers:
            layer.batch_select_indices(indices)

    @property
    def rows(self) -> int:
        return self.layers[0].rows if self.layers else 0

    @property
    def row_capacity(self) -> int:
        return self.layers[0]._key_buf.shape[0] if self.layers else 0

    def move_rows(self, src: torch.Tensor, dst: torch.Tensor, rows: int) -> None:
        """In place: rows `src` overwrite slots `dst` (one row's copy each), the first `rows` stay live."""
        for layer in self.layers:
            layer.move_rows(src, dst, rows)

    def can_append(self, other: GrowableKVCache) -> bool:
        """`other`'s rows fit the free row slots and are no longer than ours (`append_rows` then works)."""
        return (bool(self.layers) and len(other.layers) == len(self.layers)
                and self.rows + other.rows <= self.row_capacity and other.get_seq_length() <= self.get_seq_length())

    def append_rows(self, other: GrowableKVCache) -> None:
        for mine, theirs in zip(self.layers, other.layers):
            mine.append_rows(theirs)


def merge_rows(parts: list[tuple[GrowableKVCache, torch.Tensor | None]], width: int, capacity: int,
               row_capacity: int = 0) -> GrowableKVCache:
    """One cache holding, in order, rows `keep` (None = all live rows) of each part, each part's last
    min(width, its length) columns right-aligned at column `width` (zeros to their left), with room for
    `capacity` ≥ `width` columns and `row_capacity` rows (at least the rows kept). Every part must have the
    same layers; `width` must cover each kept row's real tokens (the caller's masks say where they are)."""
    n_layers = len(parts[0][0].layers)
    merged = GrowableKVCache(capacity)
    for li in range(n_layers):
        layers = [(cache.layers[li], keep) for cache, keep in parts]
        rows = sum(layer.rows if keep is None else int(keep.numel()) for layer, keep in layers)
        first = layers[0][0]
        bufs = []
        for attr in ("_key_buf", "_value_buf"):
            ref = getattr(first, attr)
            out = ref.new_empty((max(rows, row_capacity), ref.shape[1], max(capacity, width), ref.shape[-1]))
            at = 0
            for layer, keep in layers:
                src = getattr(layer, attr)
                cols = min(width, layer.length)
                block = src[: layer.rows, :, layer.length - cols : layer.length] if keep is None \
                    else src[keep, :, layer.length - cols : layer.length]
                out[at : at + block.shape[0], :, width - cols : width] = block
                if cols < width:
                    out[at : at + block.shape[0], :, : width - cols] = 0
                at += block.shape[0]
            bufs.append(out)
        merged.layers.append(PreallocatedLayer.from_buffers(bufs[0], bufs[1], width, rows))
    return merged


def supports_merge(cache: DynamicCache) -> bool:
    """True for the preallocated cache (rows can join a running batch), False for the fallback."""
    return isinstance(cache, GrowableKVCache)


class FallbackCache(DynamicCache):
    """transformers' own cache (any layer type), with the same `select_rows` call."""

    def select_rows(self, indices: torch.Tensor) -> None:
        for layer in self.layers:
            layer.batch_select_indices(indices)


def make_cache(config: object | None, capacity: int) -> DynamicCache:
    """The preallocated cache when every layer is full attention, else transformers' `DynamicCache`."""
    if _full_attention_only(config):
        return GrowableKVCache(capacity)
    return FallbackCache(config=config)
