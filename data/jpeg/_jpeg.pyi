"""The compiled decoder (_jpeg.c), as its functions parse their arguments; data.jpeg checks them first."""

import numpy as np
from _typeshed import ReadableBuffer

Crop = tuple[int, int, int, int] | None  # (top, left, height, width); None: the whole image

class DecodeError(ValueError): ...

def image_size(data: ReadableBuffer, max_pixels: int, /) -> tuple[int, int]: ...
def decode_crop(
    data: ReadableBuffer,
    max_pixels: int,
    crop: Crop,
    size: tuple[int, int],
    flip: bool,
    out: np.ndarray,  # C-contiguous uint8, (height, width, 3)
    /,
) -> None: ...
def entropy_decode(data: ReadableBuffer, max_pixels: int, crop: Crop, /) -> None: ...
def pixel_decode(data: ReadableBuffer, max_pixels: int, crop: Crop, size: tuple[int, int] = ..., /) -> None: ...
def corrupt_warnings() -> int: ...
