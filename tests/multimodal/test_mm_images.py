"""Encoded images: dataset cell formats, size limits and corrupt files fail with clear `ImageError`s."""

from __future__ import annotations

from pathlib import Path

import pytest
from mm_helpers import png_bytes

from engine.multimodal import images as im
from engine.multimodal.images import ImageError, cell_bytes, decode_b64, encode_bytes, open_b64, open_image


def test_cells_from_struct_bytes_and_paths(tmp_path: Path) -> None:
    data = png_bytes(20, 10)
    (tmp_path / "fig.png").write_bytes(data)
    assert cell_bytes({"bytes": data, "path": "ignored.png"}) == data
    assert cell_bytes({"bytes": None, "path": "fig.png"}, base_dir=tmp_path) == data
    assert cell_bytes(data) == data and cell_bytes(str(tmp_path / "fig.png")) == data
    assert decode_b64(encode_bytes(data)) == data  # Prompt.images keeps the original bytes
    assert open_b64(encode_bytes(data)).size == (20, 10)


@pytest.mark.parametrize("cell, message", [
    ({"bytes": None, "path": None}, "neither 'bytes' nor 'path'"),
    (b"", "empty"),
    ("missing.png", "does not exist"),
    (42, "is not an image"),
])
def test_unusable_cells_name_the_problem(cell: object, message: str, tmp_path: Path) -> None:
    with pytest.raises(ImageError, match=message):
        cell_bytes(cell, base_dir=tmp_path)


def test_corrupt_and_truncated_images_are_rejected() -> None:
    with pytest.raises(ImageError, match="corrupt or unsupported image"):
        open_image(b"definitely not an image")
    truncated = png_bytes(64, 64, "red")[:-40]
    with pytest.raises(ImageError, match="corrupt or unsupported image"):
        open_image(truncated)
    with pytest.raises(ImageError, match="not valid base64"):
        decode_b64("@@@not base64@@@")


def test_size_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ImageError, match="aspect ratio"):
        open_image(png_bytes(402, 2))
    monkeypatch.setattr(im, "MAX_IMAGE_PIXELS", 100)
    with pytest.raises(ImageError, match=r"11x10 = 110 pixels > the 100 limit"):
        open_image(png_bytes(11, 10))
    monkeypatch.setattr(im, "MAX_IMAGE_BYTES", 50)
    with pytest.raises(ImageError, match="encoded bytes > the 50 limit"):
        open_image(png_bytes(5, 5))
