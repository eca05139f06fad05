"""Fuzz target for data.jpeg: no file, crop or size may crash, hang or exhaust a loader worker.

Small valid files (baseline, progressive, grayscale, CMYK, YCCK, restart markers, and a PNG for the PIL
fallback) are mutated by byte flips, overwrites, insertions, deletions and truncations, then read by every entry
point with random and extreme crops, sizes and pixel limits. Each call must return a well-formed result or raise
ValueError (DecodeError is one) within PER_CALL_S seconds, and a decode must write every output pixel.

- `make test` runs a short seeded run: the same examples every time (derandomize), a few seconds.
- A long run, new examples each time (--hypothesis-seed=N replays one), by hand:
      RN50PERF_FUZZ_EXAMPLES=100000 .venv/bin/python -m pytest -q tests/fuzz [--hypothesis-seed=N]
- Under AddressSanitizer and UBSan: `make fuzz-asan` (FUZZ_EXAMPLES=30000 for a long run).
- With Atheris, optional (`pip install atheris==3.0.0`), the same target driven by libFuzzer:
      .venv/bin/python -m tests.fuzz.test_jpeg_fuzz [libFuzzer flags, e.g. -max_total_time=600]

A call still running after HANG_S seconds is stuck in C, where no thread can be stopped, so it is not shrunk: the
test stops at once with the call in its message and the file saved to $TMPDIR/jpeg-fuzz-hang.bin.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from data import jpeg
from tests import jpeg_samples as samples

PER_CALL_S = 1.0
HANG_S = 10.0
LONG_RUN = int(os.environ.get("RN50PERF_FUZZ_EXAMPLES") or 0)

SEED_ENCODINGS = ("baseline-420", "progressive-420", "gray", "cmyk-progressive", "ycck", "restart-blocks-444")
SEEDS = [*(samples.jpeg(encoding, 23, 29) for encoding in SEED_ENCODINGS), samples.png(9, 11)]
EXTREMES = [0, -1, 2**31 - 1, 2**31, -(2**31), 2**63, 2**64]
WORDS = [0, 1, 0xFF, 0x7FFF, 0xFFFF, 30_000, 65_500, 0xFFD9, 0xFFDA, 0xFFC4, 0xFFD0]  # sizes, lengths, markers

T = TypeVar("T")


class Hang(BaseException):
    """A call that did not return: a BaseException, so that Hypothesis stops instead of shrinking."""


@st.composite
def files(draw: st.DrawFn) -> bytes:
    """A seed file after up to five mutations."""
    data = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(0, 5))):
        if not data:
            break
        op = draw(st.sampled_from(["flip", "word", "insert", "delete", "truncate"]))
        at = draw(st.integers(0, len(data) - 1))
        if op == "flip":
            data[at] ^= draw(st.integers(1, 255))
        elif op == "word":
            data[at : at + 2] = draw(st.sampled_from(WORDS)).to_bytes(2, "big")
        elif op == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete":
            del data[at : at + draw(st.integers(1, 64))]
        else:
            del data[at:]
    return bytes(data)


def mostly(usual: st.SearchStrategy[T], rare: st.SearchStrategy[T]) -> st.SearchStrategy[T]:
    """`usual` about seven times in eight, `rare` otherwise: most calls should get past the argument checks."""
    return st.sampled_from([usual] * 7 + [rare]).flatmap(lambda strategy: strategy)


@st.composite
def boxes_inside(draw: st.DrawFn) -> tuple[int, int, int, int]:
    """A crop inside the seeds' 23x29 JPEGs (a mutated header may move the image's edges)."""
    top, left = draw(st.integers(0, 22)), draw(st.integers(0, 28))
    return top, left, draw(st.integers(1, 23 - top)), draw(st.integers(1, 29 - left))


coordinates = st.integers(-2, 40) | st.sampled_from(EXTREMES)
crops = mostly(st.none() | boxes_inside(), st.tuples(coordinates, coordinates, coordinates, coordinates))
sides = mostly(st.integers(1, 48), st.sampled_from([*EXTREMES, 1_000, 65_501]))  # no huge output: 2**62 allows it
limits = mostly(st.just(jpeg.MAX_PIXELS), st.sampled_from([600, 2**62]))

if LONG_RUN:
    RUN = settings(max_examples=LONG_RUN, deadline=None, print_blob=True)
else:
    RUN = settings(max_examples=300, derandomize=True, database=None, deadline=None)


@RUN
@given(files(), crops, st.tuples(sides, sides), st.booleans(), limits)
def test_every_call_returns_or_raises_value_error(data, crop, size, flip, max_pixels):
    what = f"crop={crop} size={size} flip={flip} max_pixels={max_pixels} on {len(data)} bytes"
    # What the file holds may only raise DecodeError, which the loader catches; a plain ValueError is for arguments.
    size_error = jpeg.DecodeError if arguments_ok(size, max_pixels) else ValueError
    shape = bounded(lambda: jpeg.image_size(data, max_pixels=max_pixels), data, f"image_size {what}", jpeg.DecodeError)
    if shape is not None:
        assert len(shape) == 2 and min(shape) > 0 and shape[0] * shape[1] <= max_pixels, shape

    def decode(out: np.ndarray | None = None) -> np.ndarray:
        return jpeg.decode_crop(data, crop, size, flip, out=out, max_pixels=max_pixels)

    image = bounded(decode, data, f"decode_crop {what}", size_error)
    if image is not None:
        assert image.shape == (*size, 3) and image.dtype == np.uint8
        for fill in (0, 255):  # the same into zeros and into 255s: every pixel is written, and deterministically
            again = bounded(
                lambda fill=fill: decode(np.full_like(image, fill)), data, f"decode_crop {what}", size_error
            )
            np.testing.assert_array_equal(again, image)
    if data[:2] == jpeg.JPEG_MAGIC:
        bounded(lambda: jpeg.entropy_decode(data, crop), data, f"entropy_decode {what}", jpeg.DecodeError)
        pixel_error = jpeg.DecodeError if arguments_ok(size, jpeg.MAX_PIXELS) else ValueError
        bounded(lambda: jpeg.pixel_decode(data, crop, size), data, f"pixel_decode {what}", pixel_error)


def arguments_ok(size: tuple[int, int], max_pixels: int) -> bool:
    """Whether an output size is valid under the (valid) pixel limit whatever the file (else a plain ValueError is
    right)."""
    return all(0 < n <= jpeg.MAX_SIDE for n in size) and size[0] * size[1] <= max_pixels


def bounded(call: Callable[[], T], data: bytes, what: str, expected: type[ValueError]) -> T | None:
    """call()'s result, or None if it raised `expected`; fails if it took over PER_CALL_S, raises Hang past
    HANG_S. It runs in a thread of its own: the decoder releases the GIL, so a stuck call cannot stop this one."""
    outcome: list[tuple[T | None, BaseException | None]] = []

    def target() -> None:
        try:
            outcome.append((call(), None))
        except BaseException as err:  # handed to the caller's thread
            outcome.append((None, err))

    thread = threading.Thread(target=target, daemon=True)
    start = time.perf_counter()
    thread.start()
    thread.join(HANG_S)
    elapsed = time.perf_counter() - start
    if not outcome:
        saved = Path(tempfile.gettempdir()) / "jpeg-fuzz-hang.bin"
        saved.write_bytes(data)
        raise Hang(f"{what}: still running after {HANG_S:.0f} s; the file is saved as {saved}")
    assert elapsed < PER_CALL_S, f"{what}: took {elapsed:.2f} s"
    result, error = outcome[0]
    if error is None:
        return result
    if isinstance(error, expected):
        return None
    raise error


if __name__ == "__main__":
    import atheris

    atheris.instrument_all()  # guided by Python coverage alone: the decoder's own needs a clang libFuzzer build
    atheris.Setup(sys.argv, test_every_call_returns_or_raises_value_error.hypothesis.fuzz_one_input)
    atheris.Fuzz()
