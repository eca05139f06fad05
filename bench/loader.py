"""How fast the loader decodes, per core, against its peers (torchvision, NVIDIA DALI's CPU pipeline) and the
entropy floor, from loose files and from indexed tar shards; and what shards save in reading.

    python -m bench.loader [--data DIR] [--workers N] [--seconds S] [--rounds R] [--images I] [--shard-size B]

DIR is a dataset in an ImageNet layout that data.datasets opens; its train split is timed. Without it a
photo-like 500x375 q90 set is generated (bench.photos, with a few validation images: data.datasets and the
packer want both splits). The dataset is packed into indexed tar shards of at most B bytes (data.shards.write; default
4 MB, so that a few hundred images make several shards where training would use 1 GB) in a temporary
directory. The per-core pipelines run in this process, pinned to one CPU, over the same samples in the same
order, each for S seconds per round, R rounds interleaved; each pipeline's best round counts (the machine is
shared, and interference only ever slows a round down):

  torchvision  ImageFolder + RandomResizedCrop(224) + RandomHorizontalFlip + PILToTensor, on the installed PIL
  fused        read the file, draw the crop from the header size (data.loading.crop_boxes, torchvision's parameters),
               decode only the crop, resized to 224 and flipped, into a batch slot (data.jpeg.decode_crop)
  DALI CPU     NVIDIA DALI's CPU pipeline (an optional peer: `make peers`; skipped with a note without it),
               one thread, batches of 64 (the loader row's batch): fn.readers.file,
               fn.decoders.image_random_crop (DALI's decode of the crop box alone; area (0.08, 1), ratio
               (3/4, 4/3)), fn.resize to 224x224 with its default filter (linear, antialiased: a triangle
               widened by the scale, as PIL's bilinear), fn.flip by fn.random.coin_flip; uint8 HWC on the host
  libjpeg part the fused pipeline stopping before the resize: the crop's pixels as libjpeg decodes them
               (data.jpeg.pixel_decode), i.e. what the fused pipeline costs with a free resize
  floor        the same reading and crops, with the decode replaced by Huffman decoding of the rows down to
               the crop's bottom and nothing else (data.jpeg.entropy_decode): what any decoder must pay
  ..., shards  the same pipeline reading each sample from the shards: data.shards.read's `os.pread` by offset;
               torchvision as ImageFolder would (PIL opens the bytes); DALI with fn.readers.webdataset

Rows marked "C call" time the decoder calls alone (file bytes in memory, crops drawn beforehand). "CPU/wall" is
the process's CPU time over the wall time of a row's round: at most 1 while every thread, DALI's included,
stays on the one CPU. The loader rows are the whole loader (data.loading.loader) with N worker processes, from files and
from shards. Last, what shards save: the files opened per epoch, and the time to read every sample's bytes once
in a random order, with the page cache warm and with the files' pages dropped first. The last line is JSON.
"""

from __future__ import annotations

import argparse
import functools
import importlib.metadata
import io
import itertools
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import NamedTuple

import numpy as np
import PIL
import torch
from PIL import Image, features
from torchvision import datasets, transforms

from bench import photos
from data import jpeg
from data.config import SyntheticConfig
from data.datasets import open_dataset
from data.loading.crop_boxes import CROP_RATIO, Box, random_resized_crop_box
from data.loading.loader import Batch, Crops, Loader, build_loader
from data.loading.sampler import ShardedSampler
from data.shards.__main__ import parse_size
from data.shards.read import INDEX_FIELDS, ShardSplit
from data.shards.write import BLOCK, ensure_shards
from data.sources.folder_index import FolderSplit
from data.sources.split import DatasetError, Split

SIZE = 224
AREA_MIN = 0.08
BATCH = 64  # the loader's and DALI's, at most the split's images
VAL_IMAGES = 8  # generated beside the photos
WARM_S = 0.5  # each row's warm-up (page cache, code), at most
DALI_MISSING = "DALI not installed: make peers"
TRANSFORM = transforms.Compose(
    [transforms.RandomResizedCrop(SIZE), transforms.RandomHorizontalFlip(), transforms.PILToTensor()]
)

Step = Callable[[int], object]  # one image: sample i of a split
Rate = Callable[[float], float]  # images per second, run for so many seconds
Decode = Callable[[bytes, Box, bool], object]


def timed(step: Step, count: int, seconds: float) -> float:
    """Images per second of `step(i)` over i = 0, 1, ... (cycling through `count` files) for `seconds`."""
    done, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        for _ in range(16):
            step(done % count)
            done += 1
    return done / elapsed


def timed_batches(run: Callable[[], object], batch: int, seconds: float) -> float:
    """Images per second of `run()`, which makes a whole batch of `batch` images, over whole batches."""
    done, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        run()
        done += batch
    return done / elapsed


def read_crop(split: Split, index: int) -> tuple[bytes, Box, bool]:
    """Sample `index`'s bytes, and its crop box and flip drawn from its header size."""
    data = split.read(index)
    height, width = jpeg.image_size(data)
    box, flip = random_resized_crop_box(height, width, AREA_MIN, seed=index)
    return data, box, flip


def decoders() -> dict[str, Decode]:
    """The fused decoder into a batch slot, its libjpeg part, and the floor."""
    slot = np.empty((SIZE, SIZE, 3), np.uint8)
    return {
        "fused": lambda data, box, flip: jpeg.decode_crop(data, box, (SIZE, SIZE), flip, out=slot),
        "libjpeg part": lambda data, box, _: jpeg.pixel_decode(data, box, (SIZE, SIZE)),
        "floor": lambda data, box, _: jpeg.entropy_decode(data, box),
    }


def reading(split: Split, decode: Decode) -> Step:
    """`decode` of sample i, read from `split` (files or shards) and its crop drawn."""
    return lambda i: decode(*read_crop(split, i))


def in_memory(samples: list[tuple[bytes, Box, bool]], decode: Decode) -> Step:
    """`decode` alone, of samples read and cropped beforehand (`read_crop`)."""
    return lambda i: decode(*samples[i])


def torchvision_from_shards(shards: ShardSplit) -> Step:
    """What ImageFolder does with a sample (PIL opens it, converts it to RGB, transforms it), reading shards."""
    return lambda i: TRANSFORM(Image.open(io.BytesIO(shards.read(i))).convert("RGB"))


def import_dali() -> ModuleType | None:
    """nvidia.dali, an optional peer, or None where it is not installed."""
    try:
        import nvidia.dali
    except ImportError:
        return None
    return nvidia.dali


def dali_pipeline(dali: ModuleType, reader: Callable[[], object], batch: int) -> Callable[[], object]:
    """The `run` of a one-thread DALI CPU pipeline doing the fused pipeline's work on what `reader()` (a DALI
    reader's encoded images) gives: one batch of `batch` images per call.

    It runs synchronously (exec_pipelined and exec_async off: DALI's simple executor), because the default
    executor goes on making the next batches in its own threads after each run: between this row's timed
    rounds, during the other rows'. DALI's threads start here, so they inherit this thread's CPU affinity.
    """
    fn = dali.fn
    pipe = dali.Pipeline(
        batch_size=batch,
        num_threads=1,
        device_id=None,
        seed=0,
        exec_pipelined=False,
        exec_async=False,
        prefetch_queue_depth=1,
    )
    with pipe:
        images = fn.decoders.image_random_crop(
            reader(), output_type=dali.types.RGB, random_area=[AREA_MIN, 1.0], random_aspect_ratio=list(CROP_RATIO)
        )
        images = fn.resize(images, size=[SIZE, SIZE])
        pipe.set_outputs(fn.flip(images, horizontal=fn.random.coin_flip()))
    pipe.build()
    return pipe.run


def write_dali_indexes(shards: ShardSplit, directory: Path) -> list[Path]:
    """DALI's index of each shard, made from ours rather than by scanning the tars again.

    The format is the text that DALI's wds2idx writes (wds2idx.py, installed with nvidia-dali:
    IndexCreator.create_index) and fn.readers.webdataset parses (DALI's
    dali/operators/reader/loader/webdataset_loader.cc: ParseIndexFile, ParseSampleDesc): a first line
    `v1.2 <samples>`, then a line per sample holding `<ext> <offset> <size> <member name>` for each of its
    members, the offset being that of the member's data, 512-aligned. Our index has each sample's .jpg; its
    .cls is the next member (data.shards.read), whose data starts one 512-byte header after the image's padded data.
    """
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for number, tar in enumerate(shards.files):
        lines = [f"v1.2 {np.count_nonzero(shards.shard == number)}"]
        for row in np.flatnonzero(shards.shard == number):
            offset, size, label = int(shards.offset[row]), int(shards.size[row]), str(shards.label[row])
            key = shards.member[row].decode().removesuffix(".jpg")
            label_offset = offset + size + -size % BLOCK + BLOCK
            lines.append(f"jpg {offset} {size} {key}.jpg cls {label_offset} {len(label)} {key}.cls")
        path = directory / f"{tar.stem}.idx"
        path.write_text("\n".join(lines) + "\n")
        paths.append(path)
    return paths


def dali_rates(dali: ModuleType, train: FolderSplit, shards: ShardSplit, scratch: Path) -> dict[str, Rate]:
    """DALI's rows: its pipeline reading the train files, and the same samples from the shards."""
    fn = dali.fn
    files, labels = zip(*(train[i] for i in range(len(train))), strict=True)
    tars = [str(path) for path in shards.files]
    indexes = [str(path) for path in write_dali_indexes(shards, scratch / "dali-index")]
    batch = batch_of(train)
    from_files = dali_pipeline(dali, lambda: fn.readers.file(files=list(files), labels=list(labels))[0], batch)
    from_shards = dali_pipeline(
        dali, lambda: fn.readers.webdataset(paths=tars, index_paths=indexes, ext=["jpg", "cls"])[0], batch
    )
    return {
        "DALI CPU": functools.partial(timed_batches, from_files, batch),
        "DALI CPU, shards": functools.partial(timed_batches, from_shards, batch),
    }


def per_core_rates(
    train: FolderSplit, shards: ShardSplit, dali: ModuleType | None, scratch: Path
) -> dict[str, Rate | None]:
    """Every per-core row in the table's order; DALI's are None without DALI."""

    def each(step: Step) -> Rate:
        return functools.partial(timed, step, len(train))

    decode = decoders()
    samples = [read_crop(train, i) for i in range(len(train))]
    dali_rows = dali_rates(dali, train, shards, scratch) if dali else {}
    return {
        "torchvision": each(datasets.ImageFolder(train.directory, transform=TRANSFORM).__getitem__),
        "fused": each(reading(train, decode["fused"])),
        "DALI CPU": dali_rows.get("DALI CPU"),
        "libjpeg part": each(reading(train, decode["libjpeg part"])),
        "floor": each(reading(train, decode["floor"])),
        "torchvision, shards": each(torchvision_from_shards(shards)),
        "fused, shards": each(reading(shards, decode["fused"])),
        "DALI CPU, shards": dali_rows.get("DALI CPU, shards"),
        **{f"{name}, C call": each(in_memory(samples, call)) for name, call in decode.items()},
    }


class Measured(NamedTuple):
    """A row's best images per second over the rounds, and its highest CPU time over wall time in a round."""

    img_s: float
    cpu_per_wall: float


def best_rates(rates: dict[str, Rate | None], seconds: float, rounds: int) -> dict[str, Measured | None]:
    """Each row measured over `rounds` interleaved rounds, in the same order; None for a row that cannot run."""
    present = {name: rate for name, rate in rates.items() if rate is not None}
    for rate in present.values():
        rate(min(WARM_S, seconds))
    best = {name: Measured(0.0, 0.0) for name in present}
    for _ in range(rounds):
        for name, rate in present.items():
            cpu, wall = time.process_time(), time.perf_counter()
            img_s = rate(seconds)
            cpu_per_wall = (time.process_time() - cpu) / (time.perf_counter() - wall)
            best[name] = Measured(max(best[name].img_s, img_s), max(best[name].cpu_per_wall, cpu_per_wall))
    return {name: best.get(name) for name in rates}


@contextmanager
def one_cpu() -> Iterator[int]:
    """This thread, and the threads it starts meanwhile, pinned to one CPU (yielded); torch on one thread."""
    all_cpus = os.sched_getaffinity(0)
    cpu = min(all_cpus)
    os.sched_setaffinity(0, {cpu})
    torch.set_num_threads(1)
    try:
        yield cpu
    finally:
        os.sched_setaffinity(0, all_cpus)


def batch_of(split: Split) -> int:
    return min(BATCH, len(split))


def loader_throughput(split: Split, workers: int, seconds: float) -> float:
    """Images per second out of data.loading.loader with `workers` processes (all cores together)."""
    batch = batch_of(split)
    sampler = ShardedSampler(len(split), seed=0, shuffle=True, global_batch=batch)
    return throughput(build_loader(split, Crops(train=True, size=SIZE), sampler, batch=batch, workers=workers), seconds)


def throughput(loader: Loader, seconds: float) -> float:
    """Images per second out of `loader` over `seconds`, epoch after epoch, timed from its first batch (its
    workers started and warm)."""
    batches = endless(loader)
    next(batches)
    images, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        images += len(next(batches)[1])
    return images / elapsed


def endless(loader: Loader) -> Iterator[Batch]:
    """The loader's batches, one epoch after another."""
    for epoch in itertools.count():
        loader.set_epoch(epoch)
        yield from loader


def drop_cached_pages(paths: Iterable[Path]) -> None:
    """Evict the files' pages from the page cache: posix_fadvise(DONTNEED), which needs no root, after writing
    back any dirty pages (freshly written files have some, and DONTNEED keeps those)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def read_all(split: Split, order: np.ndarray) -> float:
    """Seconds to read the bytes of every sample of `split`, in `order`."""
    start = time.perf_counter()
    for index in order:
        split.read(int(index))
    return time.perf_counter() - start


def read_times(train: FolderSplit, shards: ShardSplit, rounds: int) -> dict[str, float]:
    """Seconds to read every train sample's bytes once in one random order, best of `rounds`, from loose files
    and from shards, with the page cache warm and with the files' pages dropped first. Each shard pass reads
    through a new ShardSplit, which opens the shards on its first reads: their opens are timed as the files' are.
    """
    order = np.random.default_rng(0).permutation(len(train))
    files = [Path(train[i][0]) for i in range(len(train))]
    sources: dict[str, tuple[Callable[[], Split], list[Path]]] = {
        "files": (lambda: train, files),
        "shards": (lambda: unopened(shards), list(shards.files)),
    }
    times: dict[str, float] = {}
    for _ in range(rounds):
        for source, (fresh, paths) in sources.items():
            for cache in ("warm", "dropped"):
                if cache == "dropped":
                    drop_cached_pages(paths)
                key = f"read_{cache}_s_{source}"
                times[key] = min(times.get(key, math.inf), read_all(fresh(), order))
    return times


def unopened(shards: ShardSplit) -> ShardSplit:
    """The same shards and index, none of them opened yet. (ShardSplit has no close: the shards that it opens
    stay open until the process ends.)"""
    return ShardSplit(shards.files, {field: getattr(shards, field) for field in INDEX_FIELDS}, shards.classes)


def bits_per_pixel_of(split: Split) -> float:
    """The samples' bits over their pixels, all samples together."""
    bits = pixels = 0
    for index in range(len(split)):
        data = split.read(index)
        height, width = jpeg.image_size(data, name=split[index][0])
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


def generate_photos(root: Path, images: int) -> str:
    """bench.photos' set in ROOT/train, and VAL_IMAGES more (of the same classes) in ROOT/val; its description."""
    described = photos.generate(root, images=images).describe()
    photos.generate(root / "val-photos", images=min(images, VAL_IMAGES), seed=1)
    (root / "val-photos" / "train").rename(root / "val")
    (root / "val-photos").rmdir()
    return described


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.loader", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--data", type=Path, help="a dataset in an ImageNet layout (default: generate photo-like JPEGs)"
    )
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)), help="loader processes")
    parser.add_argument("--seconds", type=float, default=4.0, help="per pipeline and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--images", type=int, default=256, help="images to generate without --data")
    parser.add_argument("--shard-size", type=parse_size, default="4MB", help="bytes per shard, at most (default 4MB)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="rn50perf-loader-") as scratch:
        if args.data is None:
            print(generate_photos(Path(scratch) / "photos", args.images))
        root = args.data or Path(scratch) / "photos"
        try:
            train, val = open_dataset("imagenet", str(root), SyntheticConfig())
        except DatasetError as err:
            print(f"error: --data: {err}", file=sys.stderr)
            return 2
        shards, _ = ensure_shards(train, val, Path(scratch) / "shards", shard_size=args.shard_size)
        report(train, shards, Path(scratch), args)
    return 0


def report(train: FolderSplit, shards: ShardSplit, scratch: Path, args: argparse.Namespace) -> None:
    """Time everything, then print the tables and the JSON line."""
    dali = import_dali()
    with one_cpu() as cpu:  # DALI's pipelines are made (their threads started) and dropped inside
        rows = best_rates(per_core_rates(train, shards, dali, scratch), args.seconds, args.rounds)
    loaders = {
        source: loader_throughput(split, args.workers, args.seconds * 2)
        for source, split in (("files", train), ("shards", shards))
    }
    reads = read_times(train, shards, args.rounds)
    opens = {"files": len(train), "shards": len(shards.files) * max(args.workers, 1)}

    print(
        f"\n{len(train)} images ({bits_per_pixel_of(train):.2f} bits/pixel), {SIZE}x{SIZE} + flip, "
        f"one core (CPU {cpu}), best of {args.rounds} x {args.seconds:g} s; "
        f"{len(shards.files)} shards of at most {args.shard_size / 1e6:g} MB"
    )
    turbo = features.version("libjpeg_turbo")
    peer = f"DALI {dali.__version__} (CPU, 1 thread, batches of {batch_of(train)})" if dali else DALI_MISSING
    print(f"PIL {PIL.__version__} ({pil_distribution()}, libjpeg-turbo {turbo}), torch {torch.__version__}, {peer}\n")
    print_rows(rows)
    for source, rate in loaders.items():
        name = f"loader, {args.workers} workers" + (", shards" if source == "shards" else "")
        print(f"{name:<26} {rate:8.0f}   ({rate / max(args.workers, 1):.0f} per worker)")
    print_side_by_side(rows, batch_of(train))
    print_reads(reads, opens, len(shards.files), args.workers)
    print(json.dumps(figures(rows, loaders, reads, opens, len(train), args)))


def img_s(rows: dict[str, Measured | None], name: str) -> float | None:
    row = rows[name]
    return row.img_s if row else None


def ratio(rows: dict[str, Measured | None], numerator: str, denominator: str) -> float | None:
    """The rows' images per second, one over the other, rounded; None when either did not run."""
    top, bottom = img_s(rows, numerator), img_s(rows, denominator)
    return round(top / bottom, 3) if top and bottom else None


def print_rows(rows: dict[str, Measured | None]) -> None:
    """The per-core rows: images per second, against torchvision and against the floor, and CPU over wall."""
    print(f"{'pipeline':<26} {'img/s':>8} {'vs torchvision':>15} {'of floor':>9} {'CPU/wall':>9}")
    for name, row in rows.items():
        if row is None:
            print(f"{name:<26} {'-':>8}   {DALI_MISSING}")
            continue
        vs_torchvision = row.img_s / rows["torchvision"].img_s
        of_floor = row.img_s / rows["floor, C call" if "C call" in name else "floor"].img_s
        print(f"{name:<26} {row.img_s:8.0f} {vs_torchvision:14.2f}x {of_floor:8.0%} {row.cpu_per_wall:9.2f}")


def print_side_by_side(rows: dict[str, Measured | None], batch: int) -> None:
    """Fused, torchvision and DALI per core, from files and from shards."""
    print(f"\n{'per core, img/s':<26} {'files':>8} {'shards':>8}")
    for peer, label in (("torchvision", "torchvision"), ("fused", "fused"), ("DALI CPU", f"DALI CPU, batch {batch}")):
        rates = (img_s(rows, peer), img_s(rows, f"{peer}, shards"))
        print(f"{label:<26} " + " ".join(f"{rate:8.0f}" if rate else f"{'-':>8}" for rate in rates))
    ratios = (ratio(rows, "fused", "DALI CPU"), ratio(rows, "fused, shards", "DALI CPU, shards"))
    cells = " ".join(f"{r:7.2f}x" if r else f"{'-':>8}" for r in ratios)
    print(f"{'fused over DALI CPU':<26} {cells}" + ("" if all(ratios) else f"   ({DALI_MISSING})"))


def print_reads(reads: dict[str, float], opens: dict[str, int], shards: int, workers: int) -> None:
    """What shards save: files opened per epoch, and the time to read every sample's bytes once."""
    print(f"\n{'every sample read once':<26} {'opens/epoch':>17} {'cache warm':>11} {'pages dropped':>14}")
    for source, label in (("files", "loose files"), ("shards", f"{shards} shards")):
        count = str(opens[source]) if source == "files" else f"{shards} x {max(workers, 1)} workers"
        warm, dropped = reads[f"read_warm_s_{source}"], reads[f"read_dropped_s_{source}"]
        print(f"{label:<26} {count:>17} {warm * 1e3:8.1f} ms {dropped * 1e3:11.1f} ms")
    print(
        "(one process, one random order, best of the rounds. Dropped with posix_fadvise(DONTNEED), pages come back\n"
        " from this machine's disk (or its host's cache); on a network filesystem each open is also a round trip\n"
        " to its metadata server, which this does not measure.)\n"
    )


def figures(
    rows: dict[str, Measured | None],
    loaders: dict[str, float],
    reads: dict[str, float],
    opens: dict[str, int],
    images: int,
    args: argparse.Namespace,
) -> dict[str, object]:
    """The JSON line; DALI's figures are null where DALI is not installed."""

    def rate(name: str) -> float | None:
        value = img_s(rows, name)
        return round(value, 1) if value else None

    dali = [row.cpu_per_wall for name, row in rows.items() if name.startswith("DALI") and row]
    return {
        "torchvision_img_s": rate("torchvision"),
        "fused_img_s": rate("fused"),
        "floor_img_s": rate("floor"),
        "ratio_vs_torchvision": ratio(rows, "fused", "torchvision"),
        "fraction_of_floor": ratio(rows, "fused", "floor"),
        "libjpeg_part_img_s": rate("libjpeg part"),
        "libjpeg_part_fraction_of_floor": ratio(rows, "libjpeg part", "floor"),
        "fused_call_img_s": rate("fused, C call"),
        "floor_call_img_s": rate("floor, C call"),
        "dali_img_s": rate("DALI CPU"),
        "fused_over_dali": ratio(rows, "fused", "DALI CPU"),
        "torchvision_shards_img_s": rate("torchvision, shards"),
        "fused_shards_img_s": rate("fused, shards"),
        "dali_shards_img_s": rate("DALI CPU, shards"),
        "fused_over_dali_shards": ratio(rows, "fused, shards", "DALI CPU, shards"),
        "dali_batch": min(BATCH, images),
        "dali_cpu_per_wall": round(max(dali), 3) if dali else None,
        "loader_img_s": round(loaders["files"], 1),
        "loader_shards_img_s": round(loaders["shards"], 1),
        "opens_per_epoch_files": opens["files"],
        "opens_per_epoch_shards": opens["shards"],
        **{key: round(seconds, 4) for key, seconds in reads.items()},
        "workers": args.workers,
        "images": images,
        "shard_size": args.shard_size,
    }


if __name__ == "__main__":
    sys.exit(main())
