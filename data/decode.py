"""Decode a crop of an encoded image into a uint8 RGB array (PIL; the fused JPEG decoder will replace it)."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

from data.transforms import Box


class DecodeError(ValueError):
    """The bytes are not an image this loader can decode (empty, truncated, garbage)."""


def image_size(data: bytes) -> tuple[int, int]:
    """(height, width) from the header alone."""
    with _open(data) as img:
        return img.height, img.width


def decode_crop(data: bytes, crop: Box | None, size: tuple[int, int], flip: bool = False) -> np.ndarray:
    """Decode `crop` (top, left, height, width; None = whole image) resized to `size` (height, width).

    JPEG's DCT scaling (PIL's draft mode) decodes at 1/2, 1/4 or 1/8 scale whenever the crop stays at least
    as large as the output, which cuts most of the decode cost at the small training resolutions.
    """
    out_h, out_w = size
    with _open(data) as img:
        top, left, h, w = crop if crop is not None else (0, 0, img.height, img.width)
        full_w, full_h = img.width, img.height
        _draft(img, h, w, out_h, out_w)
        sx, sy = img.width / full_w, img.height / full_h
        box = (left * sx, top * sy, min((left + w) * sx, img.width), min((top + h) * sy, img.height))
        try:
            rgb = img.convert("RGB")
            resized = rgb.resize((out_w, out_h), Image.Resampling.BILINEAR, box=box, reducing_gap=None)
        except (OSError, SyntaxError, ValueError) as err:
            raise DecodeError(f"cannot decode image: {err}") from err
    if flip:
        resized = resized.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return np.asarray(resized)


def _open(data: bytes) -> Image.Image:
    try:
        return Image.open(io.BytesIO(data))
    except (OSError, SyntaxError, ValueError) as err:
        raise DecodeError(f"not a readable image ({len(data)} bytes): {err}") from err


def _draft(img: Image.Image, crop_h: int, crop_w: int, out_h: int, out_w: int) -> None:
    """Ask a JPEG for the smallest DCT scale that keeps the crop at least the output size."""
    factor = min(crop_h / out_h, crop_w / out_w)
    if img.format == "JPEG" and factor >= 2:
        img.draft("RGB", (int(img.width / factor) + 1, int(img.height / factor) + 1))
