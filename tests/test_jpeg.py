"""The fused JPEG decoder (data.jpeg): what a data loader relies on.

Each decode is checked against two references: PIL decoding the same file in full, then crop + antialiased
bilinear resize (+ flip), which is the defined semantics, and the exact source picture's region resized, which
says the crop is the region the caller asked for. The decoder may decode at 1/2, 1/4 or 1/8 DCT scale, so it
is held to "close" (PSNR, sub-pixel shift), not to bit equality with PIL.
"""

from __future__ import annotations

import functools
import io
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from configs.schema import DataConfig
from data import jpeg
from tests import jpeg_samples as samples
from tests.jpeg_samples import BIG, ENCODINGS, SMALL, SUBSAMPLINGS, TINY

REPO = Path(__file__).resolve().parent.parent
MIN_PSNR = 30.0  # dB, decoder vs PIL decode + crop + resize of the same file
MAX_SHIFT = 0.25  # output pixels: how far the decoded crop may sit from where PIL puts it


# --- references and measures ------------------------------------------------------------------------------------


@functools.cache
def pil_decode(data: bytes) -> Image.Image:
    """PIL's full decode of the file, as RGB."""
    with Image.open(io.BytesIO(data)) as img:
        return img.convert("RGB")


def pil_reference(data: bytes, crop: tuple[int, int, int, int] | None, size: tuple[int, int], flip: bool = False):
    """torchvision's recipe: full decode, crop (left, top, right, bottom), antialiased bilinear resize, flip."""
    img = pil_decode(data)
    if crop is not None:
        top, left, h, w = crop
        img = img.crop((left, top, left + w, top + h))
    img = img.resize(size[::-1], Image.Resampling.BILINEAR, reducing_gap=None)
    if flip:
        img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return np.asarray(img)


@functools.cache
def _picture(height: int, width: int) -> np.ndarray:
    return samples.picture(height, width).astype(np.float32)


def source_reference(image: tuple[int, int], crop: tuple[int, int, int, int], size: tuple[int, int]) -> np.ndarray:
    """The exact test picture's region `crop`, resized like PIL resizes (per channel, in float)."""
    top, left, h, w = crop
    region = _picture(*image)[top : top + h, left : left + w]
    channels = [
        np.asarray(Image.fromarray(np.ascontiguousarray(region[..., c])).resize(size[::-1], Image.Resampling.BILINEAR))
        for c in range(3)
    ]
    return np.stack(channels, axis=-1)


def psnr(image: np.ndarray, reference: np.ndarray) -> float:
    mse = float(np.mean((image.astype(np.float64) - reference.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


def shift(image: np.ndarray, reference: np.ndarray) -> tuple[float, float]:
    """(dy, dx) in output pixels such that image(y, x) ~ reference(y - dy, x - dx): one least-squares step on the
    reference's gradients, accurate for shifts well below the picture's stripe period."""
    ref = reference.astype(np.float64)
    gy, gx = np.gradient(ref, axis=(0, 1))
    diff = image.astype(np.float64) - ref
    a = np.array([[np.sum(gy * gy), np.sum(gy * gx)], [np.sum(gx * gy), np.sum(gx * gx)]])
    b = -np.array([np.sum(gy * diff), np.sum(gx * diff)])
    dy, dx = np.linalg.solve(a, b)
    return float(dy), float(dx)


def assert_close(image: np.ndarray, reference: np.ndarray, what: str, min_psnr: float = MIN_PSNR) -> None:
    value = psnr(image, reference)
    dy, dx = shift(image, reference)
    assert value >= min_psnr, f"{what}: PSNR {value:.1f} dB < {min_psnr} dB (shift dy={dy:+.2f} dx={dx:+.2f} px)"
    assert abs(dy) <= MAX_SHIFT and abs(dx) <= MAX_SHIFT, f"{what}: shifted by dy={dy:+.2f} dx={dx:+.2f} output px"


def test_the_geometry_check_sees_a_one_pixel_shift():
    """The shift measure, which the geometry tests lean on, sees a crop one output pixel off."""
    data = samples.jpeg("baseline-444", *BIG)
    size, crop = (40, 56), (101, 237, 180, 240)
    step_y, step_x = crop[2] // size[0], crop[3] // size[1]  # source pixels per output pixel (4, 4)
    right = pil_reference(data, crop, size)
    moved = pil_reference(data, (crop[0] - step_y, crop[1] + step_x, *crop[2:]), size)
    dy, dx = shift(moved, right)
    assert 0.8 < dy < 1.2 and -1.2 < dx < -0.8, (dy, dx)
    assert psnr(right, source_reference(BIG, crop, size)) >= 35


# --- geometry: crops land where asked, at every DCT scale -------------------------------------------------------

OUT = (40, 56)
CROP_SIZES = {  # (height, width) of the crop in BIG for OUT: the ratio picks the DCT scale a decoder may use
    "scale-1/8": (340, 460),  # 8.5x, 8.2x
    "scale-1/4": (180, 240),  # 4.5x, 4.3x
    "scale-1/2": (90, 120),  # 2.25x, 2.1x
    "scale-1": (60, 70),  # 1.5x, 1.25x
    "upscale": (25, 30),
}
POSITIONS = {  # where the crop sits in the image: (top, left) from the image and crop sizes
    "interior": lambda ih, iw, h, w: (101, 237),
    "top-left": lambda ih, iw, h, w: (0, 0),
    "top-right": lambda ih, iw, h, w: (0, iw - w),
    "bottom-left": lambda ih, iw, h, w: (ih - h, 0),
    "bottom-right": lambda ih, iw, h, w: (ih - h, iw - w),
}


def big_crop(scale: str, position: str) -> tuple[int, int, int, int]:
    h, w = CROP_SIZES[scale]
    return (*POSITIONS[position](*BIG, h, w), h, w)


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("scale", CROP_SIZES)
@pytest.mark.parametrize("encoding", SUBSAMPLINGS)
def test_crop_is_the_region_asked_for(encoding, scale, position):
    data = samples.jpeg(encoding, *BIG)
    crop = big_crop(scale, position)
    got = jpeg.decode_crop(data, crop, OUT)
    assert got.shape == (*OUT, 3) and got.dtype == np.uint8
    assert_close(got, pil_reference(data, crop, OUT), f"{encoding} crop {crop} vs PIL")
    assert_close(got, source_reference(BIG, crop, OUT), f"{encoding} crop {crop} vs source picture")


@pytest.mark.parametrize("position", ["interior", "top-right", "bottom-left"])
@pytest.mark.parametrize("scale", CROP_SIZES)
@pytest.mark.parametrize("encoding", ["baseline-420", "progressive-422"])
def test_flip_is_the_mirror_image(encoding, scale, position):
    data = samples.jpeg(encoding, *BIG)
    crop = big_crop(scale, position)
    plain = jpeg.decode_crop(data, crop, OUT)
    flipped = jpeg.decode_crop(data, crop, OUT, flip=True)
    np.testing.assert_array_equal(flipped, plain[:, ::-1])
    assert_close(flipped, pil_reference(data, crop, OUT, flip=True), f"{encoding} crop {crop} flipped vs PIL")


def test_crop_is_top_left_height_width():
    """A tall crop and a wide crop of the same corner differ, each matching its own region."""
    data = samples.jpeg("baseline-444", *SMALL)
    for crop in [(10, 150, 200, 60), (150, 10, 60, 200)]:
        got = jpeg.decode_crop(data, crop, (48, 48))
        assert_close(got, source_reference(SMALL, crop, (48, 48)), f"crop {crop} vs source picture")


# --- agreement with PIL across encodings ------------------------------------------------------------------------

CASES = {  # image size, crop, output size
    "small-whole": (SMALL, None, (40, 56)),
    "small-crop": (SMALL, (37, 101, 150, 170), (64, 64)),
    "small-upscale": (SMALL, (100, 200, 30, 40), (64, 64)),
    "big-whole": (BIG, None, (224, 224)),
    "big-crop": (BIG, (13, 29, 700, 900), (64, 80)),
    "tiny-whole": (TINY, None, (40, 56)),
    "tiny-crop": (TINY, (1, 2, 3, 4), (32, 32)),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_agrees_with_pil(encoding, case):
    image, crop, size = CASES[case]
    data = samples.jpeg(encoding, *image)
    got = jpeg.decode_crop(data, crop, size)
    assert got.shape == (*size, 3) and got.dtype == np.uint8 and got.flags.c_contiguous
    reference = pil_reference(data, crop, size)
    value = psnr(got, reference)
    assert value >= MIN_PSNR, f"{encoding} {image} crop {crop} -> {size}: PSNR {value:.1f} dB vs PIL"
    if ENCODINGS[encoding].mode == "L":
        assert np.array_equal(got[..., 0], got[..., 1]) and np.array_equal(got[..., 0], got[..., 2]), "gray not gray"


def test_ycck_sample_is_ycck_and_pil_reads_the_cmyk_back():
    """The hand-made YCCK file is what it claims to be (checks the sample, not the decoder)."""
    with Image.open(io.BytesIO(samples.jpeg("ycck", *SMALL))) as img:
        assert img.mode == "CMYK" and img.info.get("adobe_transform") == 2
        error = np.abs(np.asarray(img).astype(int) - samples.cmyk_picture(*SMALL).astype(int))
    assert error.mean() < 2 and error.max() < 12, (error.mean(), error.max())


@pytest.mark.parametrize("encoding", ["cmyk", "ycck"])
def test_cmyk_decodes_to_the_pictures_colours(encoding):
    """PIL reads both back to the CMYK picture; the decoder's RGB is that CMYK's naive conversion. The output is
    nearly full size, so no DCT scaling is involved: this is about colour, not geometry."""
    data = samples.jpeg(encoding, *SMALL)
    size = (200, 300)
    c, m, y, k = np.moveaxis(samples.cmyk_picture(*SMALL).astype(np.float64), -1, 0)
    rgb = np.stack([(255 - c) * (255 - k) / 255, (255 - m) * (255 - k) / 255, (255 - y) * (255 - k) / 255], -1)
    expected = Image.fromarray(np.rint(rgb).astype(np.uint8)).resize(size[::-1], Image.Resampling.BILINEAR)
    value = psnr(jpeg.decode_crop(data, None, size), np.asarray(expected))
    assert value >= MIN_PSNR, f"{encoding}: PSNR {value:.1f} dB vs the CMYK picture's colours"


# --- out=: decoding into a batch --------------------------------------------------------------------------------


def test_out_is_written_in_place_and_returned():
    data = samples.jpeg("baseline-420", *SMALL)
    crop, size = (20, 30, 150, 200), (48, 64)
    out = np.zeros((*size, 3), np.uint8)
    result = jpeg.decode_crop(data, crop, size, out=out)
    assert result is out
    np.testing.assert_array_equal(out, jpeg.decode_crop(data, crop, size))
    assert out.any()


def test_out_can_be_a_slot_of_a_batch():
    size = (48, 64)
    batch = np.full((4, *size, 3), 7, np.uint8)
    items = [(samples.jpeg("progressive-420", *SMALL), (5, 9, 200, 300)), (samples.jpeg("cmyk", *SMALL), None)]
    for slot, (data, crop) in zip([1, 2], items, strict=True):
        view = batch[slot]
        assert jpeg.decode_crop(data, crop, size, flip=slot == 2, out=view) is view
    np.testing.assert_array_equal(batch[1], jpeg.decode_crop(*items[0], size))
    np.testing.assert_array_equal(batch[2], jpeg.decode_crop(*items[1], size, flip=True))
    assert (batch[0] == 7).all() and (batch[3] == 7).all(), "wrote outside its slot"


@pytest.mark.parametrize(
    "out",
    [np.zeros((48, 63, 3), np.uint8), np.zeros((48, 64, 3), np.float32), np.zeros((48, 128, 3), np.uint8)[:, ::2]],
    ids=["wrong-shape", "wrong-dtype", "not-contiguous"],
)
def test_unusable_out_is_refused(out):
    with pytest.raises((ValueError, TypeError)):
        jpeg.decode_crop(samples.jpeg("baseline-420", *SMALL), None, (48, 64), out=out)


# --- image_size -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("image", [SMALL, BIG, TINY], ids=["small", "big", "tiny"])
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_image_size_matches_pil(encoding, image):
    data = samples.jpeg(encoding, *image)
    with Image.open(io.BytesIO(data)) as img:
        assert (img.height, img.width) == image
    assert tuple(jpeg.image_size(data)) == image


# --- broken files -----------------------------------------------------------------------------------------------

BROKEN = samples.broken()
NO_SIZE = ["empty", "garbage", "soi-only"]  # files with no header to read a size from
# A crop of the bottom-right corner: a decoder that stops at the crop's bottom row still needs the missing half.
BOTTOM_CROP = (SMALL[0] - 16, SMALL[1] - 32, 16, 32)


@pytest.mark.parametrize("name", BROKEN)
def test_broken_samples_are_broken_for_pil_too(name):
    with pytest.raises((OSError, SyntaxError, ValueError)), Image.open(io.BytesIO(BROKEN[name])) as img:
        img.load()


def test_broken_files_do_not_crash_the_interpreter():
    """Every broken file through every entry point in a fresh interpreter: a libjpeg exit() or a segfault shows
    as the exit status, which pytest itself would not survive."""
    script = textwrap.dedent(
        """
        from data import jpeg
        from tests import jpeg_samples

        failures = []
        for name, data in jpeg_samples.broken().items():
            calls = [
                ("decode_crop", lambda: jpeg.decode_crop(data, None, (32, 32))),
                ("decode_crop(crop)", lambda: jpeg.decode_crop(data, {BOTTOM_CROP!r}, (32, 32), flip=True)),
            ]
            if not name.startswith("truncated"):
                calls.append(("entropy_decode", lambda: jpeg.entropy_decode(data, None)))
            if name in {NO_SIZE!r}:
                calls.append(("image_size", lambda: jpeg.image_size(data)))
            for call, fn in calls:
                try:
                    fn()
                    failures.append(f"{{call}} on {{name}}: no error")
                except jpeg.DecodeError:
                    pass
                except Exception as err:
                    failures.append(f"{{call}} on {{name}}: {{type(err).__name__}}: {{err}}")
        print("\\n".join(failures) or "all refused")
        """
    ).format(NO_SIZE=set(NO_SIZE), BOTTOM_CROP=BOTTOM_CROP)
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"exit status {result.returncode}\n{result.stdout}\n{result.stderr}"
    assert result.stdout.strip() == "all refused", result.stdout


def test_decode_error_is_a_value_error():
    assert issubclass(jpeg.DecodeError, ValueError)


@pytest.mark.parametrize("crop", [None, BOTTOM_CROP], ids=["whole", "bottom-crop"])
@pytest.mark.parametrize("name", BROKEN)
def test_broken_file_raises_decode_error_naming_the_file(name, crop):
    path = f"train/n01440764/{name}.JPEG"
    with pytest.raises(jpeg.DecodeError) as raised:
        jpeg.decode_crop(BROKEN[name], crop, (32, 32), name=path)
    assert path in str(raised.value)
    with pytest.raises(jpeg.DecodeError):
        jpeg.decode_crop(BROKEN[name], crop, (32, 32))


def test_truncated_progressive_file_raises_even_for_a_top_crop():
    """Every row of a progressive JPEG needs every scan, so a top crop of a file missing its later scans fails
    too, rather than returning a blurred, half-refined crop."""
    with pytest.raises(jpeg.DecodeError):
        jpeg.decode_crop(BROKEN["truncated-progressive"], (0, 0, 16, 16), (32, 32))


def test_a_batch_slot_survives_a_broken_file():
    """A broken file raises and the loader carries on: the next decode into the same slot is whole and right."""
    data = samples.jpeg("baseline-420", *SMALL)
    out = np.zeros((32, 32, 3), np.uint8)
    with pytest.raises(jpeg.DecodeError):
        jpeg.decode_crop(BROKEN["truncated"], None, (32, 32), out=out)
    jpeg.decode_crop(data, None, (32, 32), out=out)
    np.testing.assert_array_equal(out, jpeg.decode_crop(data, None, (32, 32)))


@pytest.mark.parametrize("name", NO_SIZE)
def test_image_size_of_a_broken_file_raises(name):
    with pytest.raises(jpeg.DecodeError):
        jpeg.image_size(BROKEN[name])


# --- PNG named .JPEG: the PIL fallback --------------------------------------------------------------------------


@pytest.mark.parametrize("flip", [False, True], ids=["plain", "flip"])
@pytest.mark.parametrize(
    "crop, size", [(None, (40, 56)), ((37, 101, 150, 170), (64, 64)), ((100, 200, 30, 40), (64, 64))]
)
def test_png_decodes_through_the_fallback(crop, size, flip):
    data = samples.png(*SMALL)
    assert tuple(jpeg.image_size(data)) == SMALL
    got = jpeg.decode_crop(data, crop, size, flip=flip, name="n01739381_1309.JPEG")
    assert got.shape == (*size, 3) and got.dtype == np.uint8
    assert_close(got, pil_reference(data, crop, size, flip=flip), f"PNG crop {crop}", min_psnr=40)
    if crop is not None and not flip:
        assert_close(got, source_reference(SMALL, crop, size), f"PNG crop {crop} vs source picture", min_psnr=40)


# --- corrupt-data warnings --------------------------------------------------------------------------------------


@pytest.mark.parametrize("encoding", ["baseline-420", "progressive-444"])
def test_corrupt_data_warning_is_counted_and_the_image_still_decodes(encoding):
    data = samples.with_extraneous_bytes(samples.jpeg(encoding, *SMALL))
    before = jpeg.corrupt_warnings()
    got = jpeg.decode_crop(data, (20, 30, 150, 200), (48, 64))
    assert jpeg.corrupt_warnings() > before
    assert_close(got, pil_reference(samples.jpeg(encoding, *SMALL), (20, 30, 150, 200), (48, 64)), "after warning")


def test_clean_files_add_no_corrupt_warnings():
    before = jpeg.corrupt_warnings()
    for encoding in ENCODINGS:
        jpeg.decode_crop(samples.jpeg(encoding, *SMALL), (20, 30, 150, 200), (48, 64))
        jpeg.decode_crop(samples.jpeg(encoding, *TINY), None, (48, 64))
    assert jpeg.corrupt_warnings() == before


# --- entropy_decode and pixel_decode (the benchmark instruments) --------------------------------------------------

INSTRUMENTS = {
    "entropy": lambda data, crop: jpeg.entropy_decode(data, crop),
    "pixels": lambda data, crop: jpeg.pixel_decode(data, crop, (40, 56)),
}


@pytest.mark.parametrize("instrument", INSTRUMENTS)
@pytest.mark.parametrize("crop", [None, (100, 50, 80, 90)], ids=["whole", "crop"])
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_instruments_run_on_valid_files(encoding, crop, instrument):
    assert INSTRUMENTS[instrument](samples.jpeg(encoding, *SMALL), crop) is None


@pytest.mark.parametrize("instrument", INSTRUMENTS)
@pytest.mark.parametrize("name", ["empty", "garbage", "soi-only", "header-then-garbage"])
def test_instruments_refuse_garbage(name, instrument):
    with pytest.raises(jpeg.DecodeError):
        INSTRUMENTS[instrument](BROKEN[name], None)


# --- hostile input: no file, crop or size can hang, crash or exhaust a loader worker -------------------------------

INT_MAX = 2**31 - 1
HOSTILE_CROPS = {
    "negative-top": (-1, 0, 1, 1),
    "negative-left": (0, -1, 1, 1),
    "zero-height": (0, 0, 0, 1),
    "zero-width": (0, 0, 1, 0),
    "past-the-bottom": (SMALL[0] - 10, 0, 11, 1),
    "past-the-right": (0, SMALL[1] - 10, 1, 11),
    "top-int-max": (INT_MAX, 0, 1, 1),  # top + height wrapped to negative in C: an endless loop
    "height-int-max": (1, 0, INT_MAX, 1),  # wrapped: pixels from outside the image
    "width-int-max": (0, 1, 1, INT_MAX),
    "all-int-max": (INT_MAX,) * 4,  # was a MemoryError
    "int-min": (-INT_MAX - 1, 0, 1, 1),
    "beyond-c-int": (2**31, 0, 1, 1),
    "beyond-64-bit": (0, 0, 2**64, 1),
}
C_CROPS = [crop for crop in HOSTILE_CROPS.values() if all(-INT_MAX - 1 <= n <= INT_MAX for n in crop)]


@pytest.mark.parametrize("kind", ["jpeg", "png"])
@pytest.mark.parametrize("crop", HOSTILE_CROPS.values(), ids=HOSTILE_CROPS)
def test_a_crop_not_inside_the_image_raises_decode_error(crop, kind):
    data = samples.jpeg("baseline-420", *SMALL) if kind == "jpeg" else samples.png(*SMALL)
    with pytest.raises(jpeg.DecodeError, match="crop"):
        jpeg.decode_crop(data, crop, (32, 32))


def test_the_c_crop_check_alone_cannot_overflow():
    """The C checks without the Python ones before them, in a fresh interpreter, which a loop in C cannot hang."""
    script = textwrap.dedent(
        """
        import numpy as np
        from data import jpeg
        from data.jpeg import _jpeg
        from tests import jpeg_samples

        data, out = jpeg_samples.jpeg("baseline-420", *{small!r}), np.empty((8, 8, 3), np.uint8)
        calls = {{
            "decode_crop": lambda crop: _jpeg.decode_crop(data, jpeg.MAX_PIXELS, crop, (8, 8), False, out),
            "entropy_decode": lambda crop: _jpeg.entropy_decode(data, jpeg.MAX_PIXELS, crop),
            "pixel_decode": lambda crop: _jpeg.pixel_decode(data, jpeg.MAX_PIXELS, crop, (8, 8)),
        }}
        for crop in {crops!r}:
            for name, call in calls.items():
                try:
                    call(crop)
                    print(name, crop, "returned")
                except jpeg.DecodeError:
                    pass
        """
    ).format(crops=C_CROPS, small=SMALL)
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout == "", result.stdout + result.stderr


HOSTILE_SIZES = {
    "zero": (0, 32),
    "negative": (32, -1),
    "int-max": (INT_MAX, 1),
    "beyond-c-int": (1, 2**31),
    "beyond-64-bit": (2**64, 1),
    "taller-than-a-jpeg": (65_501, 1),
    "over-the-pixel-limit": (20_000, 20_000),
}


@pytest.mark.parametrize("size", HOSTILE_SIZES.values(), ids=HOSTILE_SIZES)
def test_an_unusable_size_raises_value_error(size):
    """Checked before the file is read, for a JPEG and for the PIL fallback alike."""
    with pytest.raises(ValueError, match="size"):
        jpeg.decode_crop(samples.jpeg("baseline-420", *SMALL), None, size)


@pytest.mark.parametrize("max_pixels", [0, -1, 2**63])
def test_an_unusable_pixel_limit_raises_value_error(max_pixels):
    data = samples.jpeg("baseline-420", *SMALL)
    with pytest.raises(ValueError, match="max_pixels"):
        jpeg.image_size(data, max_pixels=max_pixels)
    with pytest.raises(ValueError, match="max_pixels"):
        jpeg.decode_crop(data, None, (8, 8), max_pixels=max_pixels)


def test_the_default_pixel_limit_is_where_pillow_refuses_a_bomb():
    assert jpeg.MAX_PIXELS == 2 * Image.MAX_IMAGE_PIXELS
    assert DataConfig().max_pixels == jpeg.MAX_PIXELS  # data.max_pixels's default, written in the schema


@pytest.mark.parametrize("kind", ["jpeg", "png"])
def test_an_image_over_max_pixels_is_refused_naming_its_size_and_the_limit(kind):
    data = samples.jpeg("progressive-420", *SMALL) if kind == "jpeg" else samples.png(*SMALL)
    pixels = SMALL[0] * SMALL[1]
    assert jpeg.image_size(data, max_pixels=pixels) == SMALL
    assert jpeg.decode_crop(data, None, (8, 8), max_pixels=pixels).shape == (8, 8, 3)
    over = rf"{SMALL[0]}x{SMALL[1]} image \({pixels} pixels\) is over the limit of {pixels - 1} pixels"
    with pytest.raises(jpeg.DecodeError, match=over):
        jpeg.image_size(data, max_pixels=pixels - 1)
    with pytest.raises(jpeg.DecodeError, match=over):
        jpeg.decode_crop(data, None, (8, 8), max_pixels=pixels - 1)


@pytest.mark.parametrize("kind", ["jpeg", "png"])
def test_a_larger_limit_passed_explicitly_still_decodes(kind):
    data = samples.jpeg("progressive-420", *SMALL) if kind == "jpeg" else samples.png(*SMALL)
    got = jpeg.decode_crop(data, (20, 30, 150, 200), (48, 64), max_pixels=2**62)
    np.testing.assert_array_equal(got, jpeg.decode_crop(data, (20, 30, 150, 200), (48, 64)))


def test_a_png_over_pillows_own_limit_raises_decode_error():
    """Pillow refuses it in Image.open with DecompressionBombError, which is no OSError: it must not escape."""
    with pytest.raises(jpeg.DecodeError, match="pixels"):
        jpeg.image_size(samples.png_with_size(30_000, 30_000), max_pixels=2**62)


def test_a_file_in_a_format_that_is_no_raster_image_is_refused():
    """PIL opens EPS by running Ghostscript on it: a dataset's file never gets that far."""
    eps = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\nshowpage\n"
    with pytest.raises(jpeg.DecodeError, match="not a readable image"):
        jpeg.decode_crop(eps, None, (8, 8))


BOMBS = {  # the header's size -> what refuses it
    (30_000, 30_000): "over the limit of 178956970 pixels",  # took 2.6 GB and 2 s for a 16x16 crop
    (65_500, 65_500): "over the limit of 178956970 pixels",  # ran past 20 s
    (13_000, 13_000): "premature end of data segment",  # under the limit: its first scan's data runs out
}


def test_a_progressive_bomb_is_refused_at_once_in_little_memory():
    """A 2 KB progressive file whose header claims a huge image. In a fresh interpreter, so that its peak
    resident memory is the decoder's own doing."""
    script = textwrap.dedent(
        """
        import json, resource, time
        from data import jpeg
        from tests import jpeg_samples

        small = jpeg_samples.jpeg("progressive-420", 64, 64)
        for height, width in {bombs!r}:
            bomb = jpeg_samples.with_size(small, height, width)
            peak, start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.perf_counter()
            try:
                jpeg.decode_crop(bomb, (0, 0, 16, 16), (16, 16))
                error = None
            except jpeg.DecodeError as err:
                error = str(err)
            seconds = time.perf_counter() - start
            growth = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak) / 1024
            print(json.dumps({{"error": error, "seconds": seconds, "mb": growth}}))
        """
    ).format(bombs=list(BOMBS))
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    for (size, refusal), line in zip(BOMBS.items(), result.stdout.splitlines(), strict=True):
        outcome = json.loads(line)
        assert outcome["error"] is not None and refusal in outcome["error"], (size, outcome)
        assert outcome["seconds"] < 0.1 and outcome["mb"] < 8, (size, outcome)


# --- corrupt data: errors where libjpeg would make up pixels, counted warnings where it need not -----------------


@pytest.mark.parametrize("encoding", ["baseline-420", "progressive-420", "restart-rows-420"])
def test_data_that_ends_early_raises_rather_than_decoding_grey(encoding):
    with pytest.raises(jpeg.DecodeError, match="premature end"):
        jpeg.decode_crop(samples.cut_short(samples.jpeg(encoding, *SMALL)), None, (32, 32))


def test_a_crop_above_the_missing_data_still_decodes():
    """The decoder stops at the crop's bottom edge, so a top crop of a baseline file cut short needs none of what
    is missing: it decodes, to the same pixels as from the whole file."""
    data = samples.jpeg("baseline-420", *SMALL)
    crop = (0, 0, 40, 200)
    np.testing.assert_array_equal(
        jpeg.decode_crop(samples.cut_short(data), crop, (20, 100)), jpeg.decode_crop(data, crop, (20, 100))
    )


def test_a_lost_restart_interval_raises():
    data = samples.with_wrong_restart_marker(samples.jpeg("restart-rows-420", *SMALL))
    with pytest.raises(jpeg.DecodeError, match="instead of RST1"):
        jpeg.decode_crop(data, None, (32, 32))


def test_a_bad_huffman_code_decodes_as_pil_decodes_it_and_is_counted():
    """The MLPerf reference trains on what PIL decodes: a code no table has reads as a zero, the rest is the file's."""
    data = samples.with_bad_huffman_code(samples.jpeg("baseline-420", *SMALL))
    before = jpeg.corrupt_warnings()
    got = jpeg.decode_crop(data, None, (48, 64))  # the whole image: the flaw is in its bottom rows
    assert jpeg.corrupt_warnings() - before == 1
    assert_close(got, pil_reference(data, None, (48, 64)), "bad Huffman code")


def test_a_progressive_file_of_more_than_256_scans_is_refused():
    """Each scan may walk the whole image for a few bytes of file, so their number is capped."""
    assert jpeg.decode_crop(samples.many_scans(255), None, (8, 8)).shape == (8, 8, 3)  # 256 scans
    with pytest.raises(jpeg.DecodeError, match="more than 256 scans"):
        jpeg.decode_crop(samples.many_scans(256), None, (8, 8))


def test_a_warning_counts_once_per_decoded_image():
    """The loader reads the header, then decodes: a file with one flaw adds one warning, not one per call."""
    data = samples.with_extraneous_bytes(samples.jpeg("baseline-420", *SMALL))
    before = jpeg.corrupt_warnings()
    jpeg.image_size(data)
    jpeg.decode_crop(data, (20, 30, 150, 200), (48, 64))
    assert jpeg.corrupt_warnings() - before == 1


# --- the build under test -----------------------------------------------------------------------------------------


def test_rn50perf_jpeg_ext_is_the_decoder_every_importer_gets(tmp_path):
    """`make fuzz-asan` loads its ASan build this way: a copy of the decoder named by RN50PERF_JPEG_EXT is what
    data.jpeg, `from data.jpeg import _jpeg` and the PIL fallback all use."""
    copy = tmp_path / Path(jpeg._jpeg.__file__).name
    shutil.copy(jpeg._jpeg.__file__, copy)
    script = textwrap.dedent(
        """
        from data import jpeg
        from data.jpeg import _jpeg, pil
        from tests import jpeg_samples

        assert jpeg._jpeg is _jpeg is pil._jpeg and jpeg.DecodeError is _jpeg.DecodeError
        try:
            jpeg.decode_crop(jpeg_samples.png(9, 11), (0, 0, 99, 99), (8, 8))
        except _jpeg.DecodeError:
            print(_jpeg.__file__)
        """
    )
    env = {**os.environ, "RN50PERF_JPEG_EXT": str(copy)}
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and result.stdout.strip() == str(copy), result.stdout + result.stderr
