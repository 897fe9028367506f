"""Encoded images: read from dataset cells, size limits, decoding with clear errors.

A dataset cell may hold an image as `{"bytes": b"...", "path": "..."}` (Hugging Face `datasets`' Image
feature, as in verl's geo3k parquet), raw bytes, or a path to an image file. It is kept as the base64 text of
the *original* file bytes (no re-encoding), so what the rollout decodes is byte-for-byte what the trainer
decodes.

Limits (checked before the pixels are decoded, from the file header): at most `MAX_IMAGE_BYTES` encoded
bytes, at most `MAX_IMAGE_PIXELS` pixels (a decompression-bomb guard; the image processor then resizes to
its own `max_pixels`), both sides ≥ 1 and an aspect ratio max(h, w) / min(h, w) ≤ `MAX_ASPECT_RATIO`
(Qwen's `smart_resize` rejects larger ones).
"""

from __future__ import annotations

import base64
import binascii
import io
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from PIL import Image as PILImage

MAX_IMAGE_BYTES = 32 * 2**20
MAX_IMAGE_PIXELS = 64 * 2**20
MAX_ASPECT_RATIO = 200.0


class ImageError(ValueError):
    """An image that cannot be used: unreadable, corrupt, or outside the size limits."""


def encode_bytes(data: bytes) -> str:
    """The base64 text of encoded image bytes (what `Prompt.images` holds)."""
    return base64.b64encode(data).decode("ascii")


def decode_b64(image: str) -> bytes:
    """The encoded image bytes of a `Prompt.images` entry."""
    try:
        return base64.b64decode(image, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ImageError(f"not valid base64 image data ({exc})") from None


def cell_bytes(cell: Any, base_dir: Path | None = None) -> bytes:
    """The encoded bytes of one image cell: `{"bytes", "path"}` dict, bytes, or a file path (relative paths
    resolve against `base_dir`)."""
    if isinstance(cell, dict):
        data = cell.get("bytes")
        if data:
            return bytes(data)
        if cell.get("path"):
            return _read_path(str(cell["path"]), base_dir)
        raise ImageError("image cell has neither 'bytes' nor 'path'")
    if isinstance(cell, (bytes, bytearray, memoryview)):
        if not cell:
            raise ImageError("image cell is empty")
        return bytes(cell)
    if isinstance(cell, str) and cell:
        return _read_path(cell, base_dir)
    raise ImageError(f"image cell of type {type(cell).__name__} is not an image (expected bytes, a path, "
                     "or {'bytes', 'path'})")


def _read_path(path: str, base_dir: Path | None) -> bytes:
    p = Path(path).expanduser()
    if not p.is_absolute() and base_dir is not None:
        p = base_dir / p
    if not p.is_file():
        raise ImageError(f"image file {p} does not exist")
    if p.stat().st_size > MAX_IMAGE_BYTES:
        raise ImageError(f"image file {p} has {p.stat().st_size} bytes > the {MAX_IMAGE_BYTES} limit")
    return p.read_bytes()


def check_size(width: int, height: int, nbytes: int) -> None:
    """Raise `ImageError` when an image of this size breaks a limit (see the module docstring)."""
    if nbytes > MAX_IMAGE_BYTES:
        raise ImageError(f"image has {nbytes} encoded bytes > the {MAX_IMAGE_BYTES} limit")
    if width < 1 or height < 1:
        raise ImageError(f"image is {width}x{height} pixels (empty)")
    if width * height > MAX_IMAGE_PIXELS:
        raise ImageError(f"image is {width}x{height} = {width * height} pixels > the {MAX_IMAGE_PIXELS} limit")
    ratio = max(width, height) / min(width, height)
    if ratio > MAX_ASPECT_RATIO:
        raise ImageError(f"image is {width}x{height}: aspect ratio {ratio:.0f} > {MAX_ASPECT_RATIO:.0f}")


def open_image(data: bytes) -> PILImage.Image:
    """Decode encoded bytes into an RGB PIL image, checking the limits first; `ImageError` on any failure."""
    from PIL import Image, UnidentifiedImageError

    try:
        img = Image.open(io.BytesIO(data))
        check_size(img.width, img.height, len(data))
        img.load()
        return img.convert("RGB")
    except ImageError:
        raise
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        raise ImageError(f"corrupt or unsupported image ({type(exc).__name__}: {exc})") from None


def open_b64(image: str) -> PILImage.Image:
    """Decode a `Prompt.images` entry into an RGB PIL image."""
    return open_image(decode_b64(image))


def image_size(image: str) -> tuple[int, int]:
    """(width, height) of a `Prompt.images` entry from its header, limits checked; the pixels are decoded
    too, so a truncated or corrupt file fails here (at load time) rather than in a replica."""
    img = open_b64(image)
    return img.width, img.height
