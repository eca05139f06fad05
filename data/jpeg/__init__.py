"""Decode only the crop of a JPEG, resized and flipped, straight into a batch slot (C over libjpeg-turbo).

Files that are images but not JPEGs (ImageNet has a PNG named .JPEG) go through PIL with the same geometry.

No file can take down the caller: whatever the bytes, a call returns an image or raises `DecodeError` (a
ValueError), without looping and without allocating more than an image at the pixel limit needs. A crop outside
the image is a DecodeError too; arguments that are wrong whatever the file (`size`, `max_pixels`, `out`) raise
ValueError.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from data.jpeg import pil
from data.jpeg.native import _jpeg

Box = tuple[int, int, int, int]

MAX_PIXELS = 178_956_970
"""The default pixel limit: images with more pixels (width * height, from the header) are refused before any
decoding. It is Pillow's: `2 * PIL.Image.MAX_IMAGE_PIXELS`, where Pillow raises DecompressionBombError."""

MAX_SIDE = 65_500  # libjpeg's JPEG_MAX_DIMENSION: no JPEG is taller or wider
INT_MAX = 2**31 - 1  # crops are C ints
DecodeError = _jpeg.DecodeError
corrupt_warnings = _jpeg.corrupt_warnings
JPEG_MAGIC = b"\xff\xd8"
SEQUENTIAL_FRAMES = (0xC0, 0xC1)  # SOF0 and SOF1: baseline and extended sequential, Huffman-coded
OTHER_FRAMES = (0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF)  # progressive, lossless, arithmetic
UNSIZED_MARKERS = (0x01, *range(0xD0, 0xD8))  # TEM and the restart markers: no length follows
START_OF_SCAN = 0xDA


def image_size(data: bytes, name: str | None = None, max_pixels: int = MAX_PIXELS) -> tuple[int, int]:
    """(height, width) from the header alone; DecodeError if the image has more than `max_pixels` pixels."""
    max_pixels = _check_limit(max_pixels)
    with _named(name):
        if data[:2] == JPEG_MAGIC:
            return _jpeg.image_size(data, max_pixels)
        return pil.image_size(data, max_pixels)


def sequential_rgb(data: bytes) -> bool:
    """Whether `data` is a JPEG a GPU's decoder takes on its fast path: 8-bit, sequential and Huffman-coded (the
    hardware decoders of nvJPEG take baseline files; progressive ones fall to a slow path there), of one or three
    components (not CMYK). Read from the markers before the first scan; anything else, or a file whose header
    does not read, is False."""
    if data[:2] != JPEG_MAGIC:
        return False
    at = 2
    while at + 4 <= len(data):
        if data[at] != 0xFF:
            return False
        marker = data[at + 1]
        if marker == 0xFF or marker in UNSIZED_MARKERS:  # a fill byte, or a marker without a length
            at += 1 if marker == 0xFF else 2
            continue
        if marker in SEQUENTIAL_FRAMES or marker in OTHER_FRAMES:
            frame = data[at + 4 : at + 10]
            return marker in SEQUENTIAL_FRAMES and len(frame) == 6 and frame[0] == 8 and frame[5] in (1, 3)
        if marker == START_OF_SCAN:
            return False
        at += 2 + int.from_bytes(data[at + 2 : at + 4], "big")
    return False


def decode_crop(
    data: bytes,
    crop: Box | None,
    size: tuple[int, int],
    flip: bool = False,
    out: np.ndarray | None = None,
    name: str | None = None,
    max_pixels: int = MAX_PIXELS,
) -> np.ndarray:
    """Decode `crop` (top, left, height, width in original pixels; None = whole image) resized to `size`.

    The result is what PIL's crop, antialiased bilinear resize and horizontal flip give, as (height, width, 3)
    uint8 RGB, written into `out` when given (a C-contiguous uint8 array of that shape, e.g. one slot of a batch).
    An image of more than `max_pixels` pixels is refused from its header, before any decoding.
    """
    max_pixels = _check_limit(max_pixels)
    size = _check_size(size, max_pixels)
    if out is None:
        out = np.empty((*size, 3), np.uint8)
    elif out.shape != (*size, 3) or out.dtype != np.uint8 or not out.flags.c_contiguous:
        raise ValueError(f"out must be a C-contiguous uint8 array of shape {(*size, 3)}, not {out.dtype} {out.shape}")
    with _named(name):
        crop = _check_crop(crop)
        if data[:2] == JPEG_MAGIC:
            _jpeg.decode_crop(data, max_pixels, crop, size, flip, out)
        else:
            out[...] = pil.decode_crop(data, crop, size, flip, max_pixels)
    return out


def entropy_decode(data: bytes, crop: Box | None) -> None:
    """Huffman-decode the rows down to the crop's bottom and nothing else: the floor a fused decode can reach."""
    _jpeg.entropy_decode(data, MAX_PIXELS, _check_crop(crop))


def pixel_decode(data: bytes, crop: Box | None, size: tuple[int, int]) -> None:
    """libjpeg's part of `decode_crop(data, crop, size)`: the crop's pixels at the same DCT scale, not resized.

    A benchmark instrument, like `entropy_decode`: what the fused decode costs before any resizing.
    """
    _jpeg.pixel_decode(data, MAX_PIXELS, _check_crop(crop), _check_size(size, MAX_PIXELS))


def _check_limit(max_pixels: int) -> int:
    max_pixels = operator.index(max_pixels)
    if not 0 < max_pixels < 2**63:
        raise ValueError(f"max_pixels must be a positive 64-bit int, not {max_pixels}")
    return max_pixels


def _check_size(size: tuple[int, int], max_pixels: int) -> tuple[int, int]:
    height, width = (operator.index(n) for n in size)
    if not (0 < height <= MAX_SIDE and 0 < width <= MAX_SIDE and height * width <= max_pixels):
        raise ValueError(f"size {size} must be (height, width), 1 to {MAX_SIDE} each and {max_pixels} pixels at most")
    return height, width


def _check_crop(crop: Box | None) -> Box | None:
    """The crop as four C ints; the decoder then checks, without overflow, that it lies inside the image."""
    if crop is None:
        return None
    top, left, height, width = (operator.index(n) for n in crop)
    if top < 0 or left < 0 or height < 1 or width < 1 or max(top, left, height, width) > INT_MAX:
        raise DecodeError(f"crop {crop} is not (top, left, height, width) of a non-empty box inside an image")
    return top, left, height, width


@contextmanager
def _named(name: str | None) -> Iterator[None]:
    """Prefix a DecodeError's message with the file it came from, where known."""
    try:
        yield
    except DecodeError as err:
        if name is None:
            raise
        raise DecodeError(f"{name}: {err}") from None
