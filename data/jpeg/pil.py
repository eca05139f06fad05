"""The PIL fallback for images that are not JPEGs: same geometry as the fused decoder, whole-image decode."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

from data.jpeg import _jpeg


def image_size(data: bytes) -> tuple[int, int]:
    """(height, width) from the header alone."""
    with _open(data) as img:
        return img.height, img.width


def decode_crop(data: bytes, crop: tuple[int, int, int, int] | None, size: tuple[int, int], flip: bool) -> np.ndarray:
    """PIL's decode, crop, antialiased bilinear resize to `size` (height, width) and flip."""
    with _open(data) as img:
        top, left, h, w = crop if crop is not None else (0, 0, img.height, img.width)
        try:
            rgb = img.convert("RGB").crop((left, top, left + w, top + h))
        except (OSError, SyntaxError, ValueError) as err:
            raise _jpeg.DecodeError(f"cannot decode image: {err}") from err
    resized = rgb.resize(size[::-1], Image.Resampling.BILINEAR, reducing_gap=None)
    if flip:
        resized = resized.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return np.asarray(resized)


def _open(data: bytes) -> Image.Image:
    try:
        return Image.open(io.BytesIO(data))
    except (OSError, SyntaxError, ValueError) as err:
        raise _jpeg.DecodeError(f"not a readable image ({len(data)} bytes): {err}") from err
