"""Packing a dataset into indexed tar shards (their format: data.shards.read), resumably, as the command line does:

    python -m data.shards --root DATASET --out DIR [--shard-size 1GB]    any folder layout data.datasets opens
    python -m data.shards --archives DIR --out DIR [--shard-size 1GB]    image-net.org's ILSVRC2012_img_train.tar,
                                                                          ILSVRC2012_img_val.tar and the devkit
    python -m data.shards --check DIR                                     verify every shard's size and sha256

Each shard is written as DIR/.packing/shard.partial (a killed run's is overwritten by the next), flushed and renamed
when complete; then its entry (count, bytes, sha256 and index rows) is saved in DIR/.packing/. A rerun of the same
command keeps the leading shards whose size and sha256 still match their entries and packs the rest; the split
indexes and, last, manifest.json follow. Packing is deterministic (fixed tar header fields, keys from file names),
so a resumed pack is byte for byte the pack an uninterrupted run writes.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import tarfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO, NoReturn

import numpy as np
from tqdm import tqdm

from data.shards.read import (
    BLOCK,
    DEFAULT_SHARD_SIZE,
    FORMAT,
    MANIFEST,
    PACKING,
    SAVED_FIELDS,
    SPLITS,
    VERSION,
    ShardSplit,
    index_name,
    open_shards,
    read_manifest,
    shard_name,
    shard_problem,
)
from data.sources.devkit import val_wnids
from data.sources.split import DatasetError, Split
from data.sources.staging import atomic_file, build_atomically

END_OF_ARCHIVE = bytes(2 * BLOCK)
MAX_STEM = 80  # keys stay well inside ustar's 100-byte member names
TRAIN_ARCHIVE = "ILSVRC2012_img_train.tar"
VAL_ARCHIVE = "ILSVRC2012_img_val.tar"
DEVKIT_ARCHIVE = "ILSVRC2012_devkit_t12.tar.gz"
VAL_NUMBER = re.compile(r"_val_(\d+)\.[^./]+$")  # ILSVRC2012_val_00000001.JPEG -> 1
SPLIT = "|".join(SPLITS)
PACKED_FILE = re.compile(rf"{re.escape(MANIFEST)}|({SPLIT})(-\d{{6,}}\.tar|\.index\.npz)")  # a pack holds these alone
# The work folder's: its plan, each shard's entry, the shard being written; with a suffix, atomic_file's temporary
# names (`.plan.json.k3x_9a2b`) that a killed run leaves.
WORK_FILE = re.compile(rf"\.?(plan\.json|shard\.partial|({SPLIT})-\d{{6,}}\.tar\.npz)(\.\w{{8}})?")


@dataclass
class ShardEntry:
    """A complete shard: what the manifest says of it, and its rows of the split index."""

    name: str
    count: int
    bytes: int
    sha256: str
    rows: dict[str, np.ndarray]

    def manifest(self) -> dict[str, Any]:
        return {"name": self.name, "count": self.count, "bytes": self.bytes, "sha256": self.sha256}


class Keys:
    """WebDataset keys, unique within a split: the file's stem with anything but letters, digits, "_" and "-"
    replaced by "_" (webdataset takes the key to end at the first dot of a member's basename), then "_1", "_2",
    ... when already taken."""

    def __init__(self, taken: Iterable[str] = ()) -> None:
        self.taken = set(taken)

    def make(self, name: str) -> str:
        basename = re.split(r"[/:]", name)[-1]  # ":" separates a tar from its member in a ShardSplit's names
        stem = re.sub(r"[^A-Za-z0-9_-]", "_", basename.rsplit(".", 1)[0])[:MAX_STEM] or "sample"
        key, suffix = stem, 0
        while key in self.taken:
            suffix += 1
            key = f"{stem}_{suffix}"
        self.taken.add(key)
        return key


class _HashingWriter:
    """A file that hashes and counts what is written to it."""

    def __init__(self, file: BinaryIO) -> None:
        self.file = file
        self.sha256 = hashlib.sha256()
        self.position = 0

    def write(self, *chunks: bytes) -> None:
        for chunk in chunks:
            self.file.write(chunk)
            self.sha256.update(chunk)
            self.position += len(chunk)


def pack(
    splits: Mapping[str, Split], out: Path, *, shard_size: int = DEFAULT_SHARD_SIZE, source: str = ""
) -> dict[str, Any]:
    """Pack `splits` ("train" and "val") into shards under `out` and return the manifest. `out` must be new,
    empty, or the unfinished pack of the same samples with the same shard size, which is resumed."""
    out = Path(out)
    classes = _classes(splits)
    digests = {name: _samples_sha256(split) for name, split in splits.items()}
    plan = {"source": source, "shard_size": shard_size, "classes": list(classes), "source_sha256": digests}
    work = _work_folder(out, plan)
    packed = {name: _pack_split(name, split, out, work, shard_size) for name, split in splits.items()}
    entries = {
        name: {"count": len(splits[name]), "index": index_name(name), "shards": [shard.manifest() for shard in shards]}
        for name, shards in packed.items()
    }
    manifest = {"format": FORMAT, "version": VERSION, **plan, "splits": entries}
    _write_atomically(out / MANIFEST, (json.dumps(manifest, indent=1) + "\n").encode())
    _remove_work(work)
    return manifest


def _classes(splits: Mapping[str, Split]) -> tuple[str, ...]:
    if set(splits) != set(SPLITS):
        raise ValueError(f"pack needs the splits {SPLITS}, not {tuple(splits)}")
    if tuple(splits["train"].classes) != tuple(splits["val"].classes):
        raise DatasetError("train and val have different classes")
    for name, split in splits.items():
        if len(split) == 0:
            raise DatasetError(f"the {name} split holds no samples")
    return tuple(splits["train"].classes)


def _samples_sha256(split: Split) -> str:
    """A digest of the split's sample names and labels: a resumed or cached pack must be of the same samples."""
    digest = hashlib.sha256()
    for index in range(len(split)):
        name, label = split[index]
        digest.update(f"{name}\t{label}\n".encode())
    return digest.hexdigest()


def _work_folder(out: Path, plan: dict[str, Any]) -> Path:
    """`out`/.packing: the interrupted run's when it packed the same samples the same way, else a new one (then
    `out` must be new or empty)."""
    work = out / PACKING
    plan_path = work / "plan.json"
    if plan_path.is_file():
        if json.loads(plan_path.read_text()) != plan:
            raise DatasetError(
                f"{out} holds an unfinished pack of other samples or with another shard size; "
                "rerun that pack with its own options, or choose another --out"
            )
        return work
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise DatasetError(f"{out} exists and is not empty; shards are packed into a directory of their own")
    work.mkdir(parents=True)
    _write_atomically(plan_path, json.dumps(plan).encode())
    return work


def _remove_work(work: Path) -> None:
    """Remove the work folder: the files this pack or an interrupted one wrote there, then the folder itself, which
    a file put there by anyone else keeps (rmdir refuses: an OSError names it)."""
    for path in work.iterdir():
        if WORK_FILE.fullmatch(path.name):
            path.unlink()
    work.rmdir()


def _pack_split(name: str, split: Split, out: Path, work: Path, shard_size: int) -> list[ShardEntry]:
    """Pack one split into `<name>-NNNNNN.tar` after the complete shards an earlier run left, then its index."""
    shards = _complete_shards(name, out, work)
    keys = Keys(member.decode().removesuffix(".jpg") for shard in shards for member in shard.rows["member"])
    start = sum(shard.count for shard in shards)
    with tqdm(total=len(split), initial=start, desc=f"pack {name}", unit="img", disable=None, file=sys.stderr) as bar:
        while start < len(split):
            shard = _write_shard(split, start, out / shard_name(name, len(shards)), work, keys, shard_size, bar)
            _save_entry(work, shard)
            shards.append(shard)
            start += shard.count
    _write_index(out / index_name(name), shards)
    return shards


def _complete_shards(split: str, out: Path, work: Path) -> list[ShardEntry]:
    """The leading shards of `split` that an earlier run finished and whose size and sha256 still match."""
    shards: list[ShardEntry] = []
    while entry := _load_entry(work / f"{shard_name(split, len(shards))}.npz"):
        if shard_problem(out / entry.name, entry.manifest(), hashed=True):
            break
        shards.append(entry)
    return shards


def _write_shard(
    split: Split, start: int, path: Path, work: Path, keys: Keys, limit: int, bar: tqdm[NoReturn]
) -> ShardEntry:
    """Samples from `start` on into the tar `path` until the next would take it past `limit` bytes (one at
    least), written atomically through `work`/shard.partial (the pack's work folder, gone when the pack ends)."""
    rows: dict[str, list[int | bytes]] = {field: [] for field in SAVED_FIELDS}
    with atomic_file(path, partial=work / "shard.partial") as file:
        tar = _HashingWriter(file)
        for index in range(start, len(split)):
            name, label = split[index]
            data = _read(split, index, name)
            footprint = 3 * BLOCK + len(data) + -len(data) % BLOCK  # two headers, the data, the label's block
            if rows["member"] and tar.position + footprint + len(END_OF_ARCHIVE) > limit:
                break
            key = keys.make(name)
            rows["offset"].append(_add_member(tar, f"{key}.jpg", data))
            _add_member(tar, f"{key}.cls", str(label).encode())
            rows["member"].append(f"{key}.jpg".encode())
            rows["size"].append(len(data))
            rows["label"].append(label)
            bar.update()
        tar.write(END_OF_ARCHIVE)
    arrays = {
        "member": np.array(rows["member"]),
        "offset": np.array(rows["offset"], dtype=np.uint64),
        "size": np.array(rows["size"], dtype=np.uint64),
        "label": np.array(rows["label"], dtype=np.int32),
    }
    return ShardEntry(path.name, len(rows["member"]), tar.position, tar.sha256.hexdigest(), arrays)


def _read(split: Split, index: int, name: str) -> bytes:
    try:
        return split.read(index)
    except OSError as err:
        raise DatasetError(f"cannot read {name}: {err}") from None


def _add_member(tar: _HashingWriter, name: str, data: bytes) -> int:
    """Append a ustar member and return the offset of its data. The header's other fields are fixed (mode 0644,
    owner 0, mtime 0), so that packing the same samples twice gives identical shards."""
    info = tarfile.TarInfo(name)
    info.size = len(data)
    offset = tar.position + BLOCK
    tar.write(info.tobuf(tarfile.USTAR_FORMAT), data, bytes(-len(data) % BLOCK))
    return offset


def _save_entry(work: Path, shard: ShardEntry) -> None:
    with atomic_file(work / f"{shard.name}.npz") as file:
        np.savez(file, allow_pickle=False, manifest=np.array(json.dumps(shard.manifest())), **shard.rows)


def _load_entry(path: Path) -> ShardEntry | None:
    if not path.is_file():
        return None
    with np.load(path) as arrays:
        return ShardEntry(**json.loads(str(arrays["manifest"])), rows={field: arrays[field] for field in SAVED_FIELDS})


def _write_index(path: Path, shards: list[ShardEntry]) -> None:
    """The split's index: the shards' rows end to end (which shard holds a sample follows from their counts)."""
    arrays = {field: np.concatenate([shard.rows[field] for shard in shards]) for field in SAVED_FIELDS}
    with atomic_file(path) as file:
        np.savez_compressed(file, allow_pickle=False, **arrays)


def _write_atomically(path: Path, data: bytes) -> None:
    with atomic_file(path) as file:
        file.write(data)


def open_archives(directory: Path) -> dict[str, ShardSplit]:
    """image-net.org's ILSVRC2012 archives as splits read in place, without unpacking: the train tar's per-class
    tars (classes: their sorted wnids) and the flat val tar, labelled by the devkit. Only tar headers are read."""
    directory = Path(directory)
    train_tar, val_tar, devkit = (directory / name for name in (TRAIN_ARCHIVE, VAL_ARCHIVE, DEVKIT_ARCHIVE))
    missing = [path.name for path in (train_tar, val_tar, devkit) if not path.is_file()]
    if missing:
        raise DatasetError(f"{directory} lacks {', '.join(missing)} (image-net.org's ILSVRC2012 archives)")
    try:
        train = _train_images(train_tar)
        val = _val_images(val_tar, val_wnids(devkit))
    except (OSError, tarfile.TarError) as err:
        raise DatasetError(f"{directory}: an archive is unreadable: {err}") from None
    if not train:
        raise DatasetError(f"{train_tar} holds no class tars (<wnid>.tar)")
    classes = tuple(sorted({wnid for *_, wnid in train}))
    if unknown := {wnid for *_, wnid in val} - set(classes):
        raise DatasetError(f"the devkit labels validation images with wnids the train archive lacks: {sorted(unknown)}")
    return {"train": _archive_split(train_tar, train, classes), "val": _archive_split(val_tar, val, classes)}


def _train_images(archive: Path) -> list[tuple[str, int, int, str]]:
    """(member, offset, size, wnid) of each image of each class tar, in archive order (so that packing reads the
    archive front to back); a tar inside a tar is stored as is, so an image's offset in the outer file is its
    class tar's offset plus its own."""
    images = []
    with tarfile.open(archive, "r:") as outer:
        for class_tar in [m for m in outer if m.isfile() and m.name.endswith(".tar")]:
            wnid = PurePosixPath(class_tar.name).stem
            with tarfile.open(fileobj=outer.extractfile(class_tar), mode="r:") as inner:
                members = [m for m in inner if m.isfile()]
            images += [
                (f"{class_tar.name}/{m.name}", class_tar.offset_data + m.offset_data, m.size, wnid) for m in members
            ]
    return images


def _val_images(archive: Path, wnids: list[str]) -> list[tuple[str, int, int, str]]:
    """(member, offset, size, wnid) of each validation image, in archive order; image N's wnid is the devkit's Nth."""
    with tarfile.open(archive, "r:") as tar:
        members = [m for m in tar if m.isfile()]
    images = []
    for member in members:
        match = VAL_NUMBER.search(member.name)
        if not match or not 1 <= int(match[1]) <= len(wnids):
            raise DatasetError(f"{archive}: {member.name} is not one of the devkit's {len(wnids)} validation images")
        images.append((member.name, member.offset_data, member.size, wnids[int(match[1]) - 1]))
    if not images:
        raise DatasetError(f"{archive} holds no images")
    return images


def _archive_split(archive: Path, images: list[tuple[str, int, int, str]], classes: tuple[str, ...]) -> ShardSplit:
    label_of = {wnid: label for label, wnid in enumerate(classes)}
    members, offsets, sizes, wnids = zip(*images, strict=True)
    index = {
        "shard": np.zeros(len(images), dtype=np.uint32),
        "member": np.array([member.encode() for member in members]),
        "offset": np.array(offsets, dtype=np.uint64),
        "size": np.array(sizes, dtype=np.uint64),
        "label": np.array([label_of[wnid] for wnid in wnids], dtype=np.int32),
    }
    return ShardSplit([archive], index, classes, check_headers=False)


def ensure_shards(
    train: Split, val: Split, out: Path, *, shard_size: int = DEFAULT_SHARD_SIZE, source: str = ""
) -> tuple[ShardSplit, ShardSplit]:
    """`out` opened as the shards of `train` and `val`, packed first unless it already holds them. The pack is
    written in a sibling temporary directory and renamed into place, so a process never sees half of one; a
    stale or damaged pack at `out` is replaced, and a directory that holds anything else is refused."""
    out = Path(out)
    if (current := _current_pack(out, train, val)) is not None:
        return current
    if out.exists() and not _is_own_pack(out):
        raise DatasetError(
            f"{out} exists and is not a pack of `python -m data.shards` alone (its {MANIFEST}, split indexes and "
            "shards); refusing to replace it: move it away"
        )
    build_atomically(
        out,
        lambda staging: pack({"train": train, "val": val}, staging, shard_size=shard_size, source=source),
        lambda: _current_pack(out, train, val) is not None,
    )
    return open_shards(out)


def _is_own_pack(out: Path) -> bool:
    """Whether `out` holds a pack's files and nothing else, its manifest in this format (any version): a stale or
    damaged pack ensure_shards may replace. A folder of the user's, even one with a manifest.json, is not."""
    try:
        manifest = json.loads((out / MANIFEST).read_text())
        names = [path.name for path in out.iterdir()]
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and manifest.get("format") == FORMAT and all(map(PACKED_FILE.fullmatch, names))


def _current_pack(out: Path, train: Split, val: Split) -> tuple[ShardSplit, ShardSplit] | None:
    """The splits at `out` if it is a whole pack (cheap checks) of exactly these samples, else None. The manifest
    is compared first: opening the indexes and every shard is left for a pack that may be current."""
    try:
        manifest = read_manifest(out)
    except DatasetError:
        return None
    wanted = {"train": _samples_sha256(train), "val": _samples_sha256(val)}
    if manifest.get("classes") != list(train.classes) or manifest.get("source_sha256") != wanted:
        return None
    try:
        return open_shards(out)
    except DatasetError:
        return None
