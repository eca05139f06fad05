"""How fast the loader decodes, per core: the torchvision pipeline, the fused decoder, and the entropy floor.

    python -m bench.loader [--data DIR] [--workers N] [--seconds S] [--rounds R]

DIR is a dataset in the ImageNet layout (its DIR/train/<class>/*.JPEG are read); without it a photo-like
500x375 q90 set is generated (bench.photos). The per-core pipelines run in this process, pinned to one CPU,
over the same files in the same order, each for S seconds per round, R rounds interleaved; each pipeline's
best round counts (the machine is shared, and interference only ever slows a round down):

  torchvision  ImageFolder + RandomResizedCrop(224) + RandomHorizontalFlip + PILToTensor, on the installed PIL
  fused        read the file, draw the crop from the header size (data.transforms, torchvision's parameters),
               decode only the crop, resized to 224 and flipped, into a batch slot (data.jpeg.decode_crop)
  libjpeg part the same, stopping before the resize: the crop's pixels as libjpeg decodes them
               (data.jpeg.pixel_decode), i.e. what the fused pipeline costs with a free resize
  floor        the same reading and crops, with the decode replaced by Huffman decoding of the rows down to
               the crop's bottom and nothing else (data.jpeg.entropy_decode): what any decoder must pay

Rows marked "C call" time the decoder calls alone (file bytes in memory, crops drawn beforehand); the last row
is the whole loader (data.loader) with N worker processes. The last line is JSON.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import PIL
import torch
from PIL import features
from torchvision import datasets, transforms

from bench import photos
from data import jpeg
from data.folder import DatasetError, find_classes, index_split
from data.loader import Crops, build_loader
from data.sampler import ShardedSampler
from data.transforms import random_resized_crop_box

SIZE = 224
AREA_MIN = 0.08


def timed(step: Callable[[int], None], count: int, seconds: float) -> float:
    """Images per second of `step(i)` over i = 0, 1, ... (cycling through `count` files) for `seconds`."""
    done, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        for _ in range(16):
            step(done % count)
            done += 1
    return done / elapsed


def pipelines(root: Path) -> dict[str, Callable[[int], None]]:
    """Each per-core pipeline as a function of the file's position in ROOT/train."""
    folder = datasets.ImageFolder(
        str(root / "train"),
        transform=transforms.Compose(
            [transforms.RandomResizedCrop(SIZE), transforms.RandomHorizontalFlip(), transforms.PILToTensor()]
        ),
    )
    paths = [Path(path) for path, _ in folder.samples]
    slot = np.empty((SIZE, SIZE, 3), np.uint8)

    def crop(i: int) -> tuple[bytes, tuple[int, int, int, int], bool]:
        data = paths[i].read_bytes()
        height, width = jpeg.image_size(data)
        box, flip = random_resized_crop_box(height, width, AREA_MIN, seed=i)
        return data, box, flip

    def fused(i: int) -> None:
        data, box, flip = crop(i)
        jpeg.decode_crop(data, box, (SIZE, SIZE), flip, out=slot)

    def libjpeg_part(i: int) -> None:
        data, box, _ = crop(i)
        jpeg.pixel_decode(data, box, (SIZE, SIZE))

    def floor(i: int) -> None:
        data, box, _ = crop(i)
        jpeg.entropy_decode(data, box)

    in_memory = [crop(i) for i in range(len(paths))]

    def fused_call(i: int) -> None:
        data, box, flip = in_memory[i]
        jpeg.decode_crop(data, box, (SIZE, SIZE), flip, out=slot)

    def libjpeg_part_call(i: int) -> None:
        data, box, _ = in_memory[i]
        jpeg.pixel_decode(data, box, (SIZE, SIZE))

    def floor_call(i: int) -> None:
        data, box, _ = in_memory[i]
        jpeg.entropy_decode(data, box)

    return {
        "torchvision": folder.__getitem__,
        "fused": fused,
        "libjpeg part": libjpeg_part,
        "floor": floor,
        "fused, C call": fused_call,
        "libjpeg part, C call": libjpeg_part_call,
        "floor, C call": floor_call,
    }


def loader_throughput(root: Path, workers: int, seconds: float, batch: int = 64) -> float:
    """Images per second out of data.loader with `workers` processes (all cores together)."""
    split = index_split(root, "train", find_classes(root))
    batch = min(batch, len(split))
    sampler = ShardedSampler(len(split), seed=0, shuffle=True, global_batch=batch)
    loader = build_loader(split, Crops(train=True, size=SIZE), sampler, batch=batch, workers=workers)
    images, epoch = 0, 0
    iterator = iter(loader)
    next(iterator)  # workers started and warm
    start = time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        try:
            images += len(next(iterator)[1])
        except StopIteration:
            epoch += 1
            loader.set_epoch(epoch)
            iterator = iter(loader)
    return images / elapsed


def bits_per_pixel_of(files: list[Path]) -> float:
    """The files' bits over their pixels, all files together."""
    bits = pixels = 0
    for path in files:
        data = path.read_bytes()
        height, width = jpeg.image_size(data, name=str(path))
        bits, pixels = bits + 8 * len(data), pixels + height * width
    return bits / pixels


def pil_distribution() -> str:
    """Which distribution provides PIL: pillow-simd (a drop-in fork with SIMD resampling) or Pillow."""
    for name in ("pillow-simd", "Pillow"):
        try:
            importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        return name
    return "unknown distribution"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.loader", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, help="ImageFolder tree (default: generate photo-like JPEGs)")
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)), help="loader processes")
    parser.add_argument("--seconds", type=float, default=4.0, help="per pipeline and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--images", type=int, default=256, help="images to generate without --data")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="rn50perf-photos-") as scratch:
        if args.data is None:
            print(photos.generate(Path(scratch), images=args.images).describe())
        root = args.data or Path(scratch)
        try:
            find_classes(root)
        except DatasetError as err:
            print(f"error: --data: {err}", file=sys.stderr)
            return 2
        return report(root, args)


def report(root: Path, args: argparse.Namespace) -> int:
    cpu = min(os.sched_getaffinity(0))
    all_cpus = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    torch.set_num_threads(1)
    steps = pipelines(root)
    files = [Path(path) for path, _ in datasets.ImageFolder(str(root / "train")).samples]
    count = len(files)
    bits_per_pixel = bits_per_pixel_of(files)
    for step in steps.values():
        timed(step, count, 0.5)  # warm the page cache and the code
    best: dict[str, float] = {}
    for _ in range(args.rounds):
        for name, step in steps.items():
            best[name] = max(best.get(name, 0.0), timed(step, count, args.seconds))
    os.sched_setaffinity(0, all_cpus)
    loader = loader_throughput(root, args.workers, args.seconds * 2)

    print(
        f"\n{count} images ({bits_per_pixel:.2f} bits/pixel), {SIZE}x{SIZE} + flip, one core (CPU {cpu}), "
        f"best of {args.rounds} x {args.seconds:g} s"
    )
    turbo = features.version("libjpeg_turbo")
    print(f"PIL {PIL.__version__} ({pil_distribution()}, libjpeg-turbo {turbo}), torch {torch.__version__}\n")
    print(f"{'pipeline':<22} {'img/s':>8} {'vs torchvision':>15} {'of floor':>9}")
    for name, rate in best.items():
        floor = best["floor, C call" if "C call" in name else "floor"]
        print(f"{name:<22} {rate:8.0f} {rate / best['torchvision']:14.2f}x {rate / floor:8.0%}")
    print(f"{f'loader, {args.workers} workers':<22} {loader:8.0f}   ({loader / args.workers:.0f} per worker)\n")
    figures = {
        "torchvision_img_s": round(best["torchvision"], 1),
        "fused_img_s": round(best["fused"], 1),
        "floor_img_s": round(best["floor"], 1),
        "ratio_vs_torchvision": round(best["fused"] / best["torchvision"], 3),
        "fraction_of_floor": round(best["fused"] / best["floor"], 3),
        "libjpeg_part_img_s": round(best["libjpeg part"], 1),
        "libjpeg_part_fraction_of_floor": round(best["libjpeg part"] / best["floor"], 3),
        "fused_call_img_s": round(best["fused, C call"], 1),
        "floor_call_img_s": round(best["floor, C call"], 1),
        "loader_img_s": round(loader, 1),
        "workers": args.workers,
        "images": count,
        "bits_per_pixel": round(bits_per_pixel, 2),
    }
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
