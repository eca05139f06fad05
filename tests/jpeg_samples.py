"""Test images for the fused JPEG decoder, made with PIL as bytes: every encoding the decoder must read, and
broken files it must refuse.

Every image shows the same deterministic test picture: smooth cosine stripes (red varies along x, green along
y, blue along the diagonal) over ramps that make each quadrant a different colour, so a crop of a known region,
a flip or an off-by-some-pixels error shows in the pixels. `picture(h, w)` is that picture in exact floats, so a
test can compare a decode with the source region itself, free of JPEG error.
"""

from __future__ import annotations

import functools
import io
import zlib
from dataclasses import dataclass

import numpy as np
from PIL import Image

SMALL = (217, 333)  # (height, width): neither a multiple of 8 nor of 16
BIG = (757, 1003)  # large enough that crops of 2x, 4x and 8x a small output fit, with partial MCUs at the edges
TINY = (5, 7)  # smaller than every output size, and smaller than one MCU


def picture(height: int, width: int) -> np.ndarray:
    """The test picture as float64 (height, width, 3) RGB in [23, 233] (no clipping once rounded)."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    px, py = max(width / 9.0, 4.0), max(height / 7.0, 4.0)  # stripe periods: ~110 px along x in BIG
    pd = max(min(height, width) / 5.0, 4.0)
    red = 128 + 90 * np.cos(2 * np.pi * x / px + 0.3) + 15 * (x / width - 0.5)
    green = 128 + 90 * np.cos(2 * np.pi * y / py + 1.1) + 15 * (y / height - 0.5)
    blue = 128 + 90 * np.cos(2 * np.pi * (x + 0.6 * y) / pd + 2.0) + 15 * (x / width - y / height)
    return np.stack([red, green, blue], axis=-1)


def picture_u8(height: int, width: int) -> np.ndarray:
    """The test picture rounded to uint8 RGB: what the encoders are given."""
    return np.rint(picture(height, width)).astype(np.uint8)


def cmyk_picture(height: int, width: int) -> np.ndarray:
    """A (height, width, 4) uint8 CMYK version of the test picture: C, M, Y = 255 - R, G, B and a striped K."""
    rgb = picture_u8(height, width)
    y, x = np.mgrid[0:height, 0:width]
    black = np.rint(40 + 30 * np.cos(2 * np.pi * (x - y) / max(min(height, width) / 3.0, 4.0))).astype(np.uint8)
    return np.dstack([255 - rgb, black])


@dataclass(frozen=True)
class Encoding:
    """How to save the test picture: PIL mode and `Image.save` options."""

    mode: str  # "RGB", "L", "CMYK" or "YCCK" (built by `ycck_jpeg`)
    options: tuple[tuple[str, object], ...] = ()


ENCODINGS: dict[str, Encoding] = {
    "baseline-420": Encoding("RGB", (("subsampling", 2),)),
    "baseline-422": Encoding("RGB", (("subsampling", 1),)),
    "baseline-444": Encoding("RGB", (("subsampling", 0),)),
    "baseline-420-optimized": Encoding("RGB", (("subsampling", 2), ("optimize", True))),
    "progressive-420": Encoding("RGB", (("subsampling", 2), ("progressive", True))),
    "progressive-422": Encoding("RGB", (("subsampling", 1), ("progressive", True))),
    "progressive-444": Encoding("RGB", (("subsampling", 0), ("progressive", True))),
    "restart-rows-420": Encoding("RGB", (("subsampling", 2), ("restart_marker_rows", 1))),
    "restart-blocks-444": Encoding("RGB", (("subsampling", 0), ("restart_marker_blocks", 5))),
    "restart-progressive-422": Encoding("RGB", (("subsampling", 1), ("progressive", True), ("restart_marker_rows", 2))),
    "gray": Encoding("L"),
    "gray-progressive": Encoding("L", (("progressive", True),)),
    "cmyk": Encoding("CMYK"),
    "cmyk-progressive": Encoding("CMYK", (("progressive", True),)),
    "ycck": Encoding("YCCK"),
}
SUBSAMPLINGS = ("baseline-420", "baseline-422", "baseline-444")


def _save(img: Image.Image, quality: int = 90, **options: object) -> bytes:
    buffer = io.BytesIO()
    img.save(buffer, format="JPEG", quality=quality, **options)
    return buffer.getvalue()


@functools.cache
def jpeg(encoding: str, height: int, width: int) -> bytes:
    """The test picture of this size saved as a JPEG with the named encoding (a key of ENCODINGS)."""
    spec = ENCODINGS[encoding]
    options = dict(spec.options)
    if spec.mode == "YCCK":
        return ycck_jpeg(height, width, **options)
    if spec.mode == "CMYK":
        img = Image.fromarray(cmyk_picture(height, width), "CMYK")
    else:
        img = Image.fromarray(picture_u8(height, width)).convert(spec.mode)
    data = _save(img, **options)
    if options.get("restart_marker_rows") or options.get("restart_marker_blocks"):
        # A DRI segment always; RST markers between intervals once the image has more than one MCU row.
        assert b"\xff\xdd" in data and (height <= 16 or b"\xff\xd0" in data), "PIL wrote no restart markers"
    return data


def _segment(data: bytes, marker: int) -> int:
    """Offset of the first header segment with this marker (walks the segments from SOI, stops at SOS)."""
    pos = 2
    while pos + 4 <= len(data):
        assert data[pos] == 0xFF, f"not at a marker at offset {pos}"
        if data[pos + 1] == marker:
            return pos
        if data[pos + 1] == 0xDA:
            break
        pos += 2 + int.from_bytes(data[pos + 2 : pos + 4], "big")
    raise ValueError(f"no 0xFF{marker:02X} segment before the scan")


def ycck_jpeg(height: int, width: int, **options: object) -> bytes:
    """The CMYK test picture as an Adobe YCCK JPEG (APP14 transform 2), which PIL cannot write directly.

    libjpeg decodes YCCK as CMYK = 255 - RGB(Y, Cb, Cr) and K as stored, and PIL then inverts all four
    channels (Adobe CMYK is stored inverted). So the stored Y, Cb, Cr are JFIF YCbCr of (C, M, Y) taken as RGB,
    the stored K is 255 - K, and since PIL inverts when it writes CMYK too, the image handed to PIL is
    (255 - Y, 255 - Cb, 255 - Cr, K). Saved as plain CMYK (transform 0), then the transform byte is patched to 2.
    """
    cmyk = cmyk_picture(height, width).astype(np.float64)
    r, g, b = cmyk[..., 0], cmyk[..., 1], cmyk[..., 2]
    luma = 0.299 * r + 0.587 * g + 0.114 * b
    cb = 128 - 0.168736 * r - 0.331264 * g + 0.5 * b
    cr = 128 + 0.5 * r - 0.418688 * g - 0.081312 * b
    stored = np.clip(np.rint(np.stack([luma, cb, cr], axis=-1)), 0, 255).astype(np.uint8)
    handed_to_pil = np.dstack([255 - stored, cmyk_picture(height, width)[..., 3]])
    data = bytearray(_save(Image.fromarray(handed_to_pil, "CMYK"), **options))
    app14 = _segment(bytes(data), 0xEE)
    assert data[app14 + 4 : app14 + 9] == b"Adobe" and data[app14 + 15] == 0, "unexpected APP14 layout"
    data[app14 + 15] = 2  # FFEE, length (2), "Adobe", version (2), flags0 (2), flags1 (2), transform
    return bytes(data)


@functools.cache
def png(height: int, width: int) -> bytes:
    """The test picture as a PNG (what a mislabelled ImageNet file looks like: a PNG named *.JPEG)."""
    buffer = io.BytesIO()
    Image.fromarray(picture_u8(height, width)).save(buffer, format="PNG")
    return buffer.getvalue()


def png_with_size(height: int, width: int) -> bytes:
    """A small PNG whose header (IHDR, with a correct CRC) claims `height` x `width`."""
    data = png(8, 8)
    ihdr = b"IHDR" + width.to_bytes(4, "big") + height.to_bytes(4, "big") + data[24:29]
    return data[:12] + ihdr + zlib.crc32(ihdr).to_bytes(4, "big") + data[33:]


def with_extraneous_bytes(data: bytes) -> bytes:
    """The JPEG with two stray 0x00 bytes before its SOS marker: libjpeg warns "Corrupt JPEG data: 2 extraneous
    bytes before marker 0xda" and decodes the image as if they were not there."""
    sos = _segment(data, 0xDA)
    return data[:sos] + b"\x00\x00" + data[sos:]


def broken() -> dict[str, bytes]:
    """Bytes no decoder can make an image of, by name. The truncated ones lose their bottom half (baseline) or
    their later refinement scans (progressive), so a decode that needs those rows must fail."""
    good = jpeg("baseline-420", *SMALL)
    rng = np.random.default_rng(1234)
    sos = _segment(good, 0xDA)
    # Garbage after the tables but before any scan: no 0xFF, so no byte of it can pass for a marker.
    junk = rng.integers(0, 255, 4000, dtype=np.uint8).tobytes()
    progressive = jpeg("progressive-420", *SMALL)
    return {
        "empty": b"",
        "truncated": good[: len(good) // 2],  # the bottom half of the picture is missing
        "truncated-progressive": progressive[: len(progressive) // 2],  # the later scans are missing
        "garbage": rng.integers(0, 256, 5000, dtype=np.uint8).tobytes(),
        "soi-only": b"\xff\xd8",
        "header-then-garbage": good[:sos] + junk,
    }


def with_size(data: bytes, height: int, width: int) -> bytes:
    """The JPEG with the size in its frame header (SOF0, SOF1 or SOF2) replaced: a decompression bomb when the
    new size is large, since the scans still hold only the small image's data."""
    sof = min(pos for pos in (_find(data, marker) for marker in (0xC0, 0xC1, 0xC2)) if pos is not None)
    # FFCx, length (2), precision (1), height (2), width (2)
    return data[: sof + 5] + height.to_bytes(2, "big") + width.to_bytes(2, "big") + data[sof + 9 :]


def _find(data: bytes, marker: int) -> int | None:
    try:
        return _segment(data, marker)
    except ValueError:
        return None


def cut_short(data: bytes) -> bytes:
    """The first half of the JPEG, closed by an EOI marker: libjpeg warns "premature end of data segment" and
    would decode the missing rows as grey."""
    return data[: len(data) // 2] + b"\xff\xd9"


def with_bad_huffman_code(data: bytes) -> bytes:
    """The JPEG with the last six bytes of its scan replaced by stuffed 0xFF bytes: 24 one-bits, longer than any
    Huffman code, so libjpeg warns "bad Huffman code" near the image's end, as in Pillow's hopper_bad_exif.jpg."""
    end = data.rindex(b"\xff\xd9")
    return data[: end - 6] + b"\xff\x00" * 3 + data[end:]


def with_wrong_restart_marker(data: bytes) -> bytes:
    """The JPEG with its second restart marker renumbered (RST1 becomes RST5): libjpeg warns "found marker 0xd5
    instead of RST1" and drops data to resynchronise."""
    second = data.index(b"\xff\xd1", _segment(data, 0xDA))
    return data[: second + 1] + b"\xd5" + data[second + 2 :]


def many_scans(count: int) -> bytes:
    """An 8x8 grayscale progressive JPEG of `count` + 1 scans: PIL's DC scan, then `count` valid AC scans of one
    coefficient each (a first scan at Al = 13, then refinements down to Al = 0), every one coding the block's
    zeros as a single EOB: the shape of a file that makes a decoder walk the image once per scan."""
    data = jpeg("gray-progressive", 8, 8)
    first = _segment(data, 0xDA)
    component = data[first + 5]
    scan_data = first + 2 + int.from_bytes(data[first + 2 : first + 4], "big")
    dc_only = data[: data.index(b"\xff\xc4", scan_data)]  # PIL's first scan (DC), up to the next one's table
    eob_only = b"\xff\xc4\x00\x14\x10\x01" + bytes(15) + b"\x00"  # AC table 0: EOB is the 1-bit code 0
    passes = [(k, 0 if al == 13 else al + 1, al) for k in range(1, 64) for al in range(13, -1, -1)]
    scans = b"".join(
        b"\xff\xda\x00\x08\x01" + bytes([component, 0x00, k, k, ah << 4 | al]) + b"\x7f"  # EOB, padded with ones
        for k, ah, al in passes[:count]
    )
    return dc_only + eob_only + scans + b"\xff\xd9"
