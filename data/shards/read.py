"""Indexed tar shards: a dataset packed into a few large files that training reads by offset.

On network and parallel filesystems, opening 1.28 M small files is what limits the loader; a few hundred 1 GB
shards are opened once per process and read with `os.pread` at offsets from an index. The shards follow
WebDataset's naming convention (https://github.com/webdataset/webdataset: "the basename of the file is the key,
the extension is the field"): a sample is the consecutive members `<key>.jpg` (the image file's bytes, whatever
its format) and `<key>.cls` (its label in ASCII decimal), so webdataset's own tools read the shards too.

A shard directory holds:

    train-000000.tar ... val-000000.tar ...   POSIX (ustar) tars of about the pack's --shard-size each
    train.index.npz, val.index.npz            per sample: shard, member (`<key>.jpg`), offset, size, label
    manifest.json                             written last: the classes (wnids in label order) and, per split,
                                              its count and per shard its name, count, bytes and sha256

Each member is read together with the tar header before it, which must name it and its size: a shard truncated,
removed or overwritten during a run makes its members unreadable samples (data.corrupt), each named by shard and
member, instead of feeding another member's bytes or a shard's padding under this sample's label.

Each epoch is still a full pass over the whole training set in a fresh random order, as MLPerf requires: the
sampler permutes sample indices across all shards (a shard-level shuffle would not be a full permutation).

Pack with `python -m data.shards --root DIR --out DIR`, or from image-net.org's archives with `--archives DIR`;
`python -m data.shards --check DIR` verifies every shard's hash (data.shards.write does the packing).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from data.sources.split import DatasetError, UnreadableSample

FORMAT = "rn50perf-shards"
VERSION = 1
MANIFEST = "manifest.json"
PACKING = ".packing"  # the work folder of a packing run; removed once the manifest is written
SPLITS = ("train", "val")
SAVED_FIELDS = ("member", "offset", "size", "label")  # per sample, in an index file
INDEX_FIELDS = ("shard", *SAVED_FIELDS)  # and the shard, which follows from the manifest's counts per shard
DEFAULT_SHARD_SIZE = 10**9
BLOCK = 512  # a tar header's size, and the unit a member's data is padded to
NAME_FIELD, SIZE_FIELD = slice(0, 100), slice(124, 136)  # in a ustar header: NUL-padded, octal ASCII


def shard_name(split: str, number: int) -> str:
    return f"{split}-{number:06d}.tar"


def index_name(split: str) -> str:
    return f"{split}.index.npz"


class ShardSplit:
    """One split stored as byte ranges of tar files, read with `os.pread`: the Split protocol of data.sources.split.

    `split[i] -> ("train-000003.tar:n01440764_10026.jpg", label)`. The index is five numpy arrays (no Python
    object per sample), so forked loader workers share its pages instead of copying them. Each process opens
    each tar once, on its first read, and keeps it open. `check_headers`: each read checks that the member's tar
    header names it (the shards of data.shards.write; not image-net.org's archives, read in place to pack them, whose
    train images are named in their class tar's headers without the class tar's name that the index gives them).
    """

    def __init__(
        self,
        files: Sequence[Path],
        index: Mapping[str, np.ndarray],
        classes: Sequence[str],
        *,
        check_headers: bool = True,
    ) -> None:
        self.files = tuple(files)
        self.classes = tuple(classes)
        self.check_headers = check_headers
        self.shard, self.member, self.offset, self.size, self.label = (index[field] for field in INDEX_FIELDS)
        self._pid = os.getpid()
        self._fds: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self.label)

    def __getitem__(self, index: int) -> tuple[str, int]:
        return f"{self.files[self.shard[index]].name}:{self.member[index].decode()}", int(self.label[index])

    def read(self, index: int) -> bytes:
        """Sample `index`'s bytes, read in one call with its tar header. A member that its shard no longer holds
        as packed (the shard removed, cut short, or overwritten) is an UnreadableSample naming shard and member."""
        name, size = self[index][0], int(self.size[index])
        try:
            block = os.pread(self._fd(int(self.shard[index])), BLOCK + size, int(self.offset[index]) - BLOCK)
        except FileNotFoundError:
            raise UnreadableSample(f"{name}: the shard was removed since the run opened it") from None
        except OSError as err:
            raise UnreadableSample(f"{name}: {err.strerror or err}") from None
        if len(block) < BLOCK + size:
            missing = BLOCK + size - len(block)
            raise UnreadableSample(f"{name}: the shard ends {missing} bytes before this member does: truncated")
        if self.check_headers and not is_header_of(block, self.member[index], size):
            raise UnreadableSample(f"{name}: the tar header before it is not its own: the shard was overwritten")
        return block[BLOCK:]

    def _fd(self, shard: int) -> int:
        """This process's descriptor of `shard`. A forked worker opens its own: descriptors inherited across a fork
        share one open file, and with it the kernel's readahead state, which parallel readers would disturb."""
        if self._pid != os.getpid():
            self._pid, self._fds = os.getpid(), {}
        if shard not in self._fds:
            self._fds[shard] = os.open(self.files[shard], os.O_RDONLY | os.O_CLOEXEC)
        return self._fds[shard]


def is_header_of(block: bytes, member: bytes, size: int) -> bool:
    """Whether `block` starts with the ustar header of `member`, of `size` bytes (as data.shards.write writes them)."""
    name, _, _ = block[NAME_FIELD].partition(b"\0")
    try:
        return name == member and int(block[SIZE_FIELD].strip(b"\0 "), 8) == size
    except ValueError:
        return False


def open_shards(directory: Path) -> tuple[ShardSplit, ShardSplit]:
    """The train and val splits of a shard directory, after the checks that cost no reading: the manifest, the
    index, and every shard file's size (`check_shards` also verifies the hashes)."""
    directory = Path(directory)
    manifest = read_manifest(directory)
    try:
        train, val = (_open_split(directory, manifest, split) for split in SPLITS)
    except DatasetError:
        raise
    except (KeyError, TypeError, ValueError) as err:
        raise DatasetError(f"{directory / MANIFEST} is malformed ({type(err).__name__}: {err})") from None
    return train, val


def read_manifest(directory: Path) -> dict[str, Any]:
    """The manifest of a complete shard directory; a missing, unfinished or foreign directory is a DatasetError."""
    path = directory / MANIFEST
    if not directory.is_dir():
        raise DatasetError(f"{directory} is not a directory (expected shards packed by `python -m data.shards`)")
    if not path.is_file():
        if (directory / PACKING).is_dir():
            raise DatasetError(
                f"{directory} was packed by a run that did not finish (no {MANIFEST}); "
                "rerun `python -m data.shards` with the same options to complete it"
            )
        raise DatasetError(f"{directory} is not a shard directory: it has no {MANIFEST} (see python -m data.shards)")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise DatasetError(f"{path} is unreadable: {err}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise DatasetError(f"{path} is not a version {VERSION} {FORMAT} manifest")
    return manifest


def _open_split(directory: Path, manifest: dict[str, Any], split: str) -> ShardSplit:
    entry = manifest["splits"][split]
    shards = entry["shards"]
    files = [directory / shard["name"] for shard in shards]
    for shard, path in zip(shards, files, strict=True):
        _check_size(path, shard)
    index = _read_index(directory / entry["index"])
    shard = shard_of_each(shards)
    _check_index(index, shards, shard, entry["count"], len(manifest["classes"]), directory / entry["index"])
    return ShardSplit(files, index | {"shard": shard}, manifest["classes"])


def shard_of_each(shards: Sequence[Mapping[str, Any]]) -> np.ndarray:
    """The shard of each sample, in index order: the shards hold consecutive runs of samples."""
    return np.repeat(np.arange(len(shards), dtype=np.uint32), [shard["count"] for shard in shards])


def _check_size(path: Path, shard: Mapping[str, Any]) -> None:
    if problem := shard_problem(path, shard, hashed=False):
        raise DatasetError(f"{problem} in {path.parent} (python -m data.shards --check verifies every shard)")


def _read_index(path: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(path) as arrays:
            return {field: arrays[field] for field in SAVED_FIELDS}
    except (OSError, ValueError, KeyError) as err:
        raise DatasetError(f"index {path} is unreadable: {err}") from None


def _check_index(
    index: dict[str, np.ndarray], shards: list[dict[str, Any]], shard: np.ndarray, count: int, classes: int, path: Path
) -> None:
    """The index agrees with the manifest: its length, the counts per shard, labels in range, members in the shard
    (`shard`: each sample's, from shard_of_each)."""
    offset, size, label = index["offset"], index["size"], index["label"]
    if not all(len(array) == count for array in index.values()):
        raise DatasetError(f"index {path} does not hold the manifest's {count} samples")
    if sum(s["count"] for s in shards) != count:
        raise DatasetError(f"index {path} does not agree with the manifest's sample count per shard")
    if count and (label.min() < 0 or label.max() >= classes):
        raise DatasetError(f"index {path} has labels outside the manifest's {classes} classes")
    shard_bytes = np.array([s["bytes"] for s in shards], dtype=np.uint64)
    if count and np.any(offset + size > shard_bytes[shard]):
        raise DatasetError(f"index {path} points past the end of a shard")


def check_shards(directory: Path) -> tuple[int, int]:
    """Verify every shard's size and sha256 against the manifest (this reads every byte), then the index;
    returns (shards, samples). A DatasetError lists every shard that differs."""
    directory = Path(directory)
    manifest = read_manifest(directory)
    try:
        shards = [shard for split in SPLITS for shard in manifest["splits"][split]["shards"]]
        progress = tqdm(shards, desc=f"check {directory.name}", unit="shard", disable=None, file=sys.stderr)
        problems = [p for shard in progress if (p := shard_problem(directory / shard["name"], shard, hashed=True))]
    except (KeyError, TypeError) as err:
        raise DatasetError(f"{directory / MANIFEST} is malformed ({type(err).__name__}: {err})") from None
    if problems:
        raise DatasetError(f"{directory}: " + "; ".join(problems))
    train, val = open_shards(directory)
    return len(shards), len(train) + len(val)


def shard_problem(path: Path, shard: Mapping[str, Any], *, hashed: bool) -> str | None:
    """What is wrong with the shard file at `path` against its manifest entry: missing, another size (truncated
    or replaced) or, when `hashed` (which reads every byte), another sha256; None if nothing."""
    try:
        size = path.stat().st_size
    except OSError:
        return f"shard {path.name} is missing"
    if size != shard["bytes"]:
        return f"shard {path.name} has {size} bytes, the manifest says {shard['bytes']}: truncated or replaced"
    if hashed and file_sha256(path) != shard["sha256"]:
        return f"shard {path.name} has another sha256 than the manifest's (corrupted)"
    return None


def file_sha256(path: Path) -> str:
    with path.open("rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()
