"""The PIL fallback for images that are not JPEGs: same geometry as the fused decoder, whole-image decode.

The pixel limit is checked on the size PIL reads from the header, before PIL decodes anything. Pillow has its
own limit (DecompressionBombError over `2 * Image.MAX_IMAGE_PIXELS`), which a larger `max_pixels` cannot lift.
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

from data.jpeg.native import _jpeg

UNREADABLE = (OSError, SyntaxError, ValueError, Image.DecompressionBombError)
# What PIL may open: raster formats that datasets hold. PIL would otherwise try every plugin it has, EPS among them
# (which runs Ghostscript on the file).
FORMATS = ("JPEG", "PNG", "GIF", "BMP", "TIFF", "WEBP")


def image_size(data: bytes, max_pixels: int) -> tuple[int, int]:
    """(height, width) from the header alone."""
    with _open(data, max_pixels) as img:
        return img.height, img.width


def decode_crop(
    data: bytes, crop: tuple[int, int, int, int] | None, size: tuple[int, int], flip: bool, max_pixels: int
) -> np.ndarray:
    """PIL's decode, crop, antialiased bilinear resize to `size` (height, width) and flip."""
    with _open(data, max_pixels) as img:
        top, left, h, w = crop if crop is not None else (0, 0, img.height, img.width)
        if top + h > img.height or left + w > img.width:
            raise _jpeg.DecodeError(f"crop {crop} is not inside the {img.height}x{img.width} image")
        try:
            rgb = img.convert("RGB").crop((left, top, left + w, top + h))
        except UNREADABLE as err:
            raise _jpeg.DecodeError(f"cannot decode image: {err}") from err
    resized = rgb.resize(size[::-1], Image.Resampling.BILINEAR, reducing_gap=None)
    if flip:
        resized = resized.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return np.asarray(resized)


def _open(data: bytes, max_pixels: int) -> Image.Image:
    """The image, its header read and nothing decoded; DecodeError for unreadable bytes or too many pixels."""
    try:
        img = Image.open(io.BytesIO(data), formats=FORMATS)
    except UNREADABLE as err:
        raise _jpeg.DecodeError(f"not a readable image ({len(data)} bytes): {err}") from err
    height, width = img.height, img.width
    if height * width > max_pixels:
        img.close()
        pixels = height * width
        raise _jpeg.DecodeError(f"{height}x{width} image ({pixels} pixels) is over the limit of {max_pixels} pixels")
    return img
