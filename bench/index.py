"""What the dataset index costs at ImageNet's size: the compact index (data.sources.folder_index) against a tuple of
Paths.

    python -m bench.index [--classes 1000] [--per-class 1281] [--val-per-class 50] [--reads 300000]
                          [--layout torchvision|kaggle|imagenet_org] [--root DIR]

A fake tree in the chosen layout is made under DIR (default: rn50perf-index-bench in the temporary folder), once,
and reused by later runs: its files are hard links to one tiny JPEG per class, so 1.33 M files cost directory
entries, not data. Each row below then runs in a fresh forked process, so that none sees another's memory:

  compact, build            data.datasets.open_dataset, train and val, with an empty index cache: scan the tree
                            (with the threads data.sources.folder_index.scan_threads picks for its filesystem) and
                            save the index
  compact, build, N threads the same with the other choice (16 threads on a local filesystem, 1 on a network one)
  compact, reopen           open_dataset again, the index saved: check the folders' stamps, read it back
  paths (peer)              the representation data.sources.folder_index had before: each file a Path, the labels a
                            tuple of ints, listed with Path.iterdir and sorted as its index_split did (the same files)

For each: the wall time; the process's growth in anonymous memory (Anonymous in /proc/self/smaps_rollup, before
and after: what it allocated; Rss would also count the code pages a forked child maps again as it runs); then a
forked worker, as a DataLoader worker is, does `--reads` random train[i] reads, and its growth in private dirty
memory is what it copied from its parent (reading a Python object writes its reference count; reading a numpy
array writes nothing). The page cache is as the tree left it (warm when just made); the index cache is cold for
the builds.

The last line is JSON: build_s and build_threads (the chosen count), build_other_s and build_other_threads,
reopen_s; index_mb (the growth on reopening, what every later
start holds), index_after_build_mb (the first start's, freed scratch memory included), arrays_mb (their nbytes),
worker_mb; and the peer's peer_build_s, peer_mb, peer_worker_mb.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from bench.folders import claim
from data.config import SyntheticConfig
from data.datasets import open_dataset
from data.sources import folder_index
from data.sources.devkit import write_devkit
from data.sources.folder_index import FlatLabels, FolderSplit, find_classes, is_image
from data.sources.layouts import DEVKIT, KAGGLE_IMAGES, KAGGLE_VAL_LABELS, find_layout
from data.sources.synthetic import CACHE_ENV

LAYOUTS = ("torchvision", "kaggle", "imagenet_org")
MB = 1 << 20


@dataclass(frozen=True)
class PathSplit:
    """The peer: data.sources.folder_index's Split before the compact index, a Path object and a Python int per file."""

    paths: tuple[Path, ...]
    labels: tuple[int, ...]
    classes: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[str, int]:
        return str(self.paths[index]), self.labels[index]


@dataclass(frozen=True)
class Row:
    name: str
    seconds: float
    process_mb: float  # the process's growth
    arrays_mb: float | None  # the compact index's arrays, train and val
    files: int
    worker_mb: float  # a forked worker's growth in private dirty memory after the reads


def make_tree(parent: Path, layout: str, classes: int, per_class: int, val_per_class: int) -> Path:
    """The fake tree for these sizes under `parent`, made unless a previous run completed it (a marker beside it)."""
    root = parent / f"{layout}-{classes}x{per_class}+{val_per_class}"
    done = root.with_name(root.name + ".done")
    if done.exists():
        return root
    wnids = [f"n{index:08d}" for index in range(classes)]
    images = root / KAGGLE_IMAGES if layout == "kaggle" else root
    for wnid in wnids:
        first = images / "train" / wnid / f"{wnid}_0.JPEG"
        first.parent.mkdir(parents=True, exist_ok=True)
        first.write_bytes(tiny_jpeg())
        for i in range(1, per_class):
            os.link(first, first.with_name(f"{wnid}_{i}.JPEG"))
    val_classes = [wnids[i % classes] for i in range(classes * val_per_class)]  # ILSVRC2012_val_00000001 first
    for number, wnid in enumerate(val_classes, start=1):
        name = f"ILSVRC2012_val_{number:08d}.JPEG"
        into = images / "val" / wnid if layout == "torchvision" else images / "val"
        into.mkdir(parents=True, exist_ok=True)
        os.link(images / "train" / wnid / f"{wnid}_0.JPEG", into / name)
    if layout == "kaggle":
        rows = "".join(f"ILSVRC2012_val_{n:08d},{wnid} 1 2 3 4 \n" for n, wnid in enumerate(val_classes, start=1))
        (root / KAGGLE_VAL_LABELS).write_text(f"ImageId,PredictionString\n{rows}")
    if layout == "imagenet_org":
        write_devkit(root / DEVKIT, wnids, val_classes)
    backdate(root)
    done.touch()
    return root


def tiny_jpeg() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), (120, 60, 30)).save(buffer, format="JPEG")
    return buffer.getvalue()


def backdate(root: Path, seconds: float = 60.0) -> None:
    """Date the tree's folders and label files `seconds` back, as those of a tree copied earlier
    (data.sources.folder_index does not save the index of a tree changed in the last few seconds: its RACY_NS)."""
    when = time.time() - seconds
    for directory, _, files in os.walk(root):
        labels = [name for name in files if not is_image(name)]
        for path in [directory, *(os.path.join(directory, name) for name in labels)]:
            os.utime(path, (when, when))


def paths_split(directory: Path, classes: tuple[str, ...], labels: FlatLabels | None) -> PathSplit:
    """The peer's listing, as the old index_split did: class folders sorted, each one's files sorted as Paths."""
    label_of = {wnid: label for label, wnid in enumerate(classes)}
    if labels:
        wnid_of = labels.wnids()
        files = sorted(f for f in directory.iterdir() if is_image(f.name))
        return PathSplit(tuple(files), tuple(label_of[wnid_of[f.stem]] for f in files), classes)
    paths: list[Path] = []
    targets: list[int] = []
    for class_dir in sorted(p for p in directory.iterdir() if p.is_dir()):
        files = sorted(f for f in class_dir.iterdir() if is_image(f.name))
        paths += files
        targets += [label_of[class_dir.name]] * len(files)
    return PathSplit(tuple(paths), tuple(targets), classes)


def open_peer(root: Path) -> tuple[PathSplit, PathSplit]:
    layout = find_layout(root)
    classes = find_classes(layout.train)
    return paths_split(layout.train, classes, None), paths_split(layout.val, classes, layout.val_labels)


def open_compact(root: Path, cache: Path, threads: int | None = None) -> tuple[FolderSplit, FolderSplit]:
    """open_dataset as train.py calls it, with the index cache in `cache` (called in a child process: it sets the
    child's environment and, given `threads`, data.sources.folder_index's choice of threads for this filesystem)."""
    os.environ[CACHE_ENV] = str(cache)
    if threads is not None:
        folder_index.scan_threads = lambda directory: threads
    return open_dataset("imagenet", str(root), SyntheticConfig())


def smaps_kb() -> dict[str, int]:
    """This process's memory totals in kB: Rss, Private_Dirty, Anonymous, ..."""
    lines = Path("/proc/self/smaps_rollup").read_text().splitlines()[1:]
    return {key.rstrip(":"): int(value) for key, value, *_ in (line.split() for line in lines)}


def in_child(work: Callable[[], dict]) -> dict:
    """`work()` in a forked process; its dict comes back through a pipe as JSON."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        try:
            figures = work()
        except BaseException as err:
            figures = {"error": repr(err)}
        with os.fdopen(write_end, "w") as pipe:
            json.dump(figures, pipe)
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        figures = json.loads(pipe.read() or '{"error": "the child died"}')
    os.waitpid(pid, 0)
    if "error" in figures:
        raise RuntimeError(figures["error"])
    return figures


def worker_growth_mb(split: FolderSplit | PathSplit, reads: int) -> float:
    """A forked worker's growth in private dirty memory after `reads` random split[i] reads."""

    def work() -> dict:
        indices = np.random.default_rng(0).integers(0, len(split), reads).tolist()
        before = smaps_kb()["Private_Dirty"]
        for index in indices:
            split[index]
        return {"mb": (smaps_kb()["Private_Dirty"] - before) / 1024}

    return in_child(work)["mb"]


def index_mb(*splits: FolderSplit) -> float:
    """The compact index's arrays, in MB."""
    return sum(s.names.nbytes + s.offsets.nbytes + s.labels.nbytes for s in splits) / MB


def measure(name: str, open_splits: Callable[[], tuple], reads: int) -> Row:
    """Open the splits in a fresh process: the time, its memory growth, and a forked worker's after the reads."""

    def work() -> dict:
        before = smaps_kb()["Anonymous"]
        start = time.perf_counter()
        train, val = open_splits()
        seconds = time.perf_counter() - start
        process_mb = (smaps_kb()["Anonymous"] - before) / 1024
        arrays_mb = index_mb(train, val) if isinstance(train, FolderSplit) else None
        files = len(train) + len(val)
        return {
            "seconds": seconds,
            "process_mb": process_mb,
            "arrays_mb": arrays_mb,
            "files": files,
            "worker_mb": worker_growth_mb(train, reads),
        }

    return Row(name, **in_child(work))


def report(root: Path, args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="rn50perf-index-") as scratch:
        cache, forced = Path(scratch, "chosen"), Path(scratch, "forced")
        chosen = folder_index.scan_threads(root)
        other = 1 if chosen > 1 else folder_index.SCAN_THREADS
        build = measure("compact, build", lambda: open_compact(root, cache), args.reads)
        saved = list(cache.glob("index/*.npys"))
        if len(saved) != 2:
            raise RuntimeError(f"the build saved {len(saved)} index files, not 2 (train and val)")
        rows = [
            build,
            measure(
                f"compact, build, {other} thread{'s' * (other > 1)}",
                lambda: open_compact(root, forced, other),
                args.reads,
            ),
            measure("compact, reopen", lambda: open_compact(root, cache), args.reads),
            measure("paths (peer)", lambda: open_peer(root), args.reads),
        ]
    files = {row.files for row in rows}
    if len(files) != 1:
        raise RuntimeError(f"the rows indexed different numbers of files: {files}")
    reopen, peer = rows[2], rows[3]
    print(
        f"\n{build.files:,} files ({args.classes} classes x {args.per_class} train + {args.val_per_class} val), "
        f"{args.layout} layout, {folder_index.filesystem_type(root) or 'unknown'} filesystem: builds with {chosen} "
        f"thread{'s' * (chosen > 1)}; worker: {args.reads:,} random train[i] reads\n"
    )
    print(f"{'':<26} {'seconds':>8} {'process MB':>11} {'arrays MB':>10} {'worker +MB':>11}")
    for row in rows:
        arrays = f"{row.arrays_mb:10.1f}" if row.arrays_mb is not None else f"{'-':>10}"
        print(f"{row.name:<26} {row.seconds:8.2f} {row.process_mb:11.1f} {arrays} {row.worker_mb:11.1f}")
    figures = {
        "files": build.files,
        "layout": args.layout,
        "reads": args.reads,
        "build_s": round(build.seconds, 3),
        "build_threads": chosen,
        "build_other_s": round(rows[1].seconds, 3),
        "build_other_threads": other,
        "reopen_s": round(reopen.seconds, 3),
        "index_mb": round(reopen.process_mb, 3),
        "index_after_build_mb": round(build.process_mb, 3),
        "arrays_mb": round(reopen.arrays_mb, 3),
        "worker_mb": round(reopen.worker_mb, 3),
        "peer_build_s": round(peer.seconds, 3),
        "peer_mb": round(peer.process_mb, 3),
        "peer_worker_mb": round(peer.worker_mb, 3),
    }
    print()
    print(json.dumps(figures), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.index", description=__doc__.split("\n\n")[0])
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--per-class", type=int, default=1281, help="training images per class")
    parser.add_argument("--val-per-class", type=int, default=50)
    parser.add_argument("--reads", type=int, default=300_000, help="random reads by the forked worker")
    parser.add_argument("--layout", choices=LAYOUTS, default="torchvision")
    parser.add_argument("--root", type=Path, default=Path(tempfile.gettempdir()) / "rn50perf-index-bench")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    root = make_tree(claim(args.root, "--root"), args.layout, args.classes, args.per_class, args.val_per_class)
    print(f"tree: {root} ({time.perf_counter() - start:.1f} s to make or find)")
    return report(root, args)


if __name__ == "__main__":
    sys.exit(main())
