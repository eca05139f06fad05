"""Photo-like JPEGs for the loader benchmark: natural-image statistics, so the bit rate resembles real photos.

A decoder's speed depends on how many bits it has to Huffman-decode, so a benchmark image must look like a
photo to an encoder: smooth regions, edges and texture, not flat colour or white noise. These come out at
about 3.8 bits per pixel at quality 90 (ImageNet's training files average about 110 KB, typically 4 to 6 bits
per pixel, so real files spend more of their decode in Huffman decoding than these).

Each image is a 1/f^alpha ("pink") luminance field, the power spectrum of natural scenes, with steeper and
weaker chroma fields (colour changes slowly in photos), lit by a smooth gradient, with a few hard-edged
objects, patches of fine texture (foliage, fabric) and sensor grain, encoded by PIL at the given quality
with its default 4:2:0 chroma subsampling.

Layout: ``DIR/train/<wnid>/<wnid>_<i>.JPEG`` (ImageFolder and `data.sources.folder_index` read it). Every image is
seeded from (seed, class, index), so the set is the same whatever the number of worker processes.

    python -m bench.photos DIR [--images 400] [--classes 8] [--size 500x375] [--quality 90] [--seed 0]
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import time
from dataclasses import dataclass
from multiprocessing import Pool
from pathlib import Path

import numpy as np
from PIL import Image

from bench.folders import claim

DEFAULT_SIZE = (500, 375)  # width x height, ImageNet's most common size
DEFAULT_QUALITY = 90


@dataclass(frozen=True)
class PhotoSet:
    """Where a generated set lives and what it weighs."""

    root: Path
    images: int
    width: int
    height: int
    quality: int
    mean_bytes: float

    @property
    def bits_per_pixel(self) -> float:
        return 8 * self.mean_bytes / (self.width * self.height)

    def describe(self) -> str:
        return (
            f"{self.images} photo-like {self.width}x{self.height} q{self.quality} JPEGs in {self.root}: "
            f"mean {self.mean_bytes / 1024:.1f} KiB, {self.bits_per_pixel:.2f} bits/pixel"
        )


def generate(
    root: Path,
    *,
    images: int = 400,
    classes: int = 8,
    size: tuple[int, int] = DEFAULT_SIZE,
    quality: int = DEFAULT_QUALITY,
    seed: int = 0,
    workers: int = 0,
) -> PhotoSet:
    """Write `images` JPEGs, dealt evenly over `classes` class folders, under ``root/train``.

    `size` is (width, height); `workers` processes render them (0: one per usable CPU).
    """
    if images < 1 or classes < 1:
        raise ValueError("images and classes must be at least 1")
    width, height = size
    jobs = []
    for i in range(images):
        name = f"n{i % classes:08d}"
        path = Path(root) / "train" / name / f"{name}_{i // classes}.JPEG"
        jobs.append((path, width, height, quality, seed, i % classes, i // classes))
    for name in {job[0].parent for job in jobs}:
        name.mkdir(parents=True, exist_ok=True)
    workers = min(workers or len(os.sched_getaffinity(0)), images)
    if workers > 1:
        with Pool(workers) as pool:
            sizes = pool.map(_write, jobs, chunksize=8)
    else:
        sizes = [_write(job) for job in jobs]
    return PhotoSet(Path(root), images, width, height, quality, float(np.mean(sizes)))


def encode(pixels: np.ndarray, quality: int = DEFAULT_QUALITY) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG", quality=quality)
    return buffer.getvalue()


def render(width: int, height: int, rng: np.random.Generator) -> np.ndarray:
    """One photo-like (height, width, 3) uint8 RGB image."""
    # Chroma and the texture mask change slowly: draw them at half resolution and repeat each value 2x2,
    # which is what the encoder's 4:2:0 subsampling keeps of chroma anyway.
    half_h, half_w = (height + 1) // 2, (width + 1) // 2
    luma, texture = _pink(height, width, [rng.uniform(0.95, 1.25), rng.uniform(0.2, 0.5)], rng)
    cb, cr, mask = _pink(half_h, half_w, [rng.uniform(1.3, 1.6), rng.uniform(1.3, 1.6), 1.6], rng)
    y = 115 + rng.uniform(-25, 25) + luma * rng.uniform(28, 42)
    u = rng.uniform(-20, 20) + cb * rng.uniform(6, 14)
    v = rng.uniform(-20, 20) + cr * rng.uniform(6, 14)

    # Light falling from one side.
    rows = np.linspace(-1, 1, height, dtype=np.float32)[:, None]
    cols = np.linspace(-1, 1, width, dtype=np.float32)[None, :]
    angle = rng.uniform(0, 2 * np.pi)
    y += rng.uniform(10, 35) * (np.cos(angle) * cols + np.sin(angle) * rows)

    # Patches of fine texture (foliage, fabric, gravel) where a smooth field runs high.
    patches = _upsample(np.clip((mask - rng.uniform(0.0, 0.8)) * 2, 0, 1), height, width)
    y += patches * texture * rng.uniform(10, 22)

    # A few hard-edged objects: ellipses and boxes of their own shade, keeping some of the scene's texture.
    half_rows, half_cols = rows[::2], cols[:, ::2]
    for _ in range(rng.integers(2, 6)):
        cy, cx, ry, rx = *rng.uniform(-0.9, 0.9, size=2), *rng.uniform(0.1, 0.5, size=2)
        ellipse = rng.random() < 0.5
        keep = rng.uniform(0.3, 0.7)
        shade, tint = rng.uniform(40, 210), rng.uniform(-35, 35, size=2)
        for plane, r, c, value in ((y, rows, cols, shade - 115 * keep), (u, half_rows, half_cols, tint[0])):
            _paint(plane, r, c, (cy, cx, ry, rx), ellipse, keep, value)
        _paint(v, half_rows, half_cols, (cy, cx, ry, rx), ellipse, keep, tint[1])

    y += (rng.random(y.shape, dtype=np.float32) - 0.5) * 5  # sensor grain, standard deviation 1.4
    u, v = _upsample(u, height, width), _upsample(v, height, width)
    rgb = np.stack([y + 1.402 * v, y - 0.344136 * u - 0.714136 * v, y + 1.772 * u], axis=-1)
    return np.clip(rgb + 0.5, 0, 255).astype(np.uint8)


def _pink(height: int, width: int, alphas: list[float], rng: np.random.Generator) -> np.ndarray:
    """Unit-variance real (height, width) fields with amplitude spectra 1/f^alpha, one per alpha.

    The spectrum's components are uniform rather than Gaussian (cheaper to draw); the inverse transform sums
    so many of them that the field is Gaussian all the same.
    """
    fy = np.fft.fftfreq(height).astype(np.float32)[:, None]
    fx = np.fft.rfftfreq(width).astype(np.float32)[None, :]
    radius = np.sqrt(fx * fx + fy * fy)
    radius[0, 0] = 1.0
    shape = (len(alphas), *radius.shape)
    spectrum = (rng.random((*shape, 2), dtype=np.float32) - 0.5).view(np.complex64)[..., 0]
    spectrum *= np.exp(-np.asarray(alphas, dtype=np.float32)[:, None, None] * np.log(radius))
    spectrum[:, 0, 0] = 0
    fields = np.fft.irfft2(spectrum, s=(height, width)).astype(np.float32)
    fields /= fields.std(axis=(1, 2), keepdims=True)
    return fields


def _upsample(plane: np.ndarray, height: int, width: int) -> np.ndarray:
    return plane.repeat(2, axis=0).repeat(2, axis=1)[:height, :width]


def _paint(
    plane: np.ndarray,
    rows: np.ndarray,
    cols: np.ndarray,
    shape: tuple[float, float, float, float],
    ellipse: bool,
    keep: float,
    value: float,
) -> None:
    """Inside the ellipse or box (centre cy, cx; radii ry, rx in [-1, 1] coordinates): value + keep * plane."""
    cy, cx, ry, rx = shape
    r0, r1 = np.searchsorted(rows[:, 0], [cy - ry, cy + ry])
    c0, c1 = np.searchsorted(cols[0], [cx - rx, cx + rx])
    if r0 >= r1 or c0 >= c1:
        return
    r, c = rows[r0:r1], cols[:, c0:c1]
    inside = ((r - cy) / ry) ** 2 + ((c - cx) / rx) ** 2 < 1 if ellipse else np.ones((r1 - r0, c1 - c0), bool)
    region = plane[r0:r1, c0:c1]
    region[inside] = value + keep * region[inside]


def _write(job: tuple[Path, int, int, int, int, int, int]) -> int:
    path, width, height, quality, seed, class_index, index = job
    data = encode(render(width, height, np.random.default_rng([seed, class_index, index])), quality)
    path.write_bytes(data)
    return len(data)


def _size(text: str) -> tuple[int, int]:
    try:
        width, height = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected WIDTHxHEIGHT, got {text!r}") from None
    if width < 8 or height < 8:
        raise argparse.ArgumentTypeError(f"image size must be at least 8x8, got {text!r}")
    return width, height


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.photos", description=__doc__.split("\n\n")[0])
    parser.add_argument("root", type=Path, help="a new or empty directory to write DIR/train/<class>/*.JPEG into")
    parser.add_argument("--images", type=int, default=400)
    parser.add_argument("--classes", type=int, default=8)
    parser.add_argument("--size", type=_size, default=DEFAULT_SIZE, help="WIDTHxHEIGHT (default 500x375)")
    parser.add_argument("--quality", type=int, default=DEFAULT_QUALITY)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=0, help="processes (default: one per CPU)")
    args = parser.parse_args(argv)
    if args.images < 1 or args.classes < 1 or not 1 <= args.quality <= 100:
        parser.error("--images and --classes must be at least 1, --quality in [1, 100]")
    start = time.perf_counter()
    photos = generate(
        claim(args.root, "DIR"),
        images=args.images,
        classes=args.classes,
        size=args.size,
        quality=args.quality,
        seed=args.seed,
        workers=args.workers,
    )
    print(f"{photos.describe()} ({time.perf_counter() - start:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
