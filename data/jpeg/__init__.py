"""Decode only the crop of a JPEG, resized and flipped, straight into a batch slot (C over libjpeg-turbo).

Files that are images but not JPEGs (ImageNet has a PNG named .JPEG) go through PIL with the same geometry.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from data.jpeg import _jpeg, pil

Box = tuple[int, int, int, int]

DecodeError = _jpeg.DecodeError
corrupt_warnings = _jpeg.corrupt_warnings

JPEG_MAGIC = b"\xff\xd8"


def image_size(data: bytes, name: str | None = None) -> tuple[int, int]:
    """(height, width) from the header alone."""
    with _named(name):
        return _jpeg.image_size(data) if data[:2] == JPEG_MAGIC else pil.image_size(data)


def decode_crop(
    data: bytes,
    crop: Box | None,
    size: tuple[int, int],
    flip: bool = False,
    out: np.ndarray | None = None,
    name: str | None = None,
) -> np.ndarray:
    """Decode `crop` (top, left, height, width in original pixels; None = whole image) resized to `size`.

    The result is what PIL's crop, antialiased bilinear resize and horizontal flip give, as (height, width, 3)
    uint8 RGB, written into `out` when given (a C-contiguous uint8 array of that shape, e.g. one slot of a batch).
    """
    if out is None:
        out = np.empty((*size, 3), np.uint8)
    elif out.shape != (*size, 3) or out.dtype != np.uint8 or not out.flags.c_contiguous:
        raise ValueError(f"out must be a C-contiguous uint8 array of shape {(*size, 3)}, not {out.dtype} {out.shape}")
    with _named(name):
        if data[:2] == JPEG_MAGIC:
            _jpeg.decode_crop(data, crop, size, flip, out)
        else:
            out[...] = pil.decode_crop(data, crop, size, flip)
    return out


def entropy_decode(data: bytes, crop: Box | None) -> None:
    """Huffman-decode the rows down to the crop's bottom and nothing else: the floor a fused decode can reach."""
    _jpeg.entropy_decode(data, crop)


def pixel_decode(data: bytes, crop: Box | None, size: tuple[int, int]) -> None:
    """libjpeg's part of `decode_crop(data, crop, size)`: the crop's pixels at the same DCT scale, not resized.

    A benchmark instrument, like `entropy_decode`: what the fused decode costs before any resizing.
    """
    _jpeg.pixel_decode(data, crop, size)


@contextmanager
def _named(name: str | None) -> Iterator[None]:
    """Prefix a DecodeError's message with the file it came from, where known."""
    try:
        yield
    except DecodeError as err:
        if name is None:
            raise
        raise DecodeError(f"{name}: {err}") from None
