"""One split of a folder tree as a compact index: the file names packed in one byte buffer, the labels in int16.

At ImageNet's size (1.28 M files) a tuple of Path objects costs about 400 MB in every process, and each forked
loader worker copies those pages as it reads them, because reading an object writes its reference count. Numpy
arrays hold no per-file objects: reading them writes nothing, so the workers share the parent's pages.

The index is built once with os.scandir (on a network filesystem by a pool of threads, which overlaps the
server's latency) and saved as <cache>/index/<split>-<hash of its resolved path>.npys: its arrays (format,
stamps, classes, names, offsets, labels, sizes) written one after another by np.save, read back in order by np.load.
Each file's size, from the one stat the scan makes of it, lets a read tell a file truncated or replaced since the
index was built from its own bytes, without another system call.
Later starts reuse it while the split's folder, its class folders, the label files and the dataset's root keep
their inode, mtime and size (adding or removing a file changes its folder's mtime). An index is not saved while
the tree is still changing (mtimes within RACY_NS of the scan): a second change in the same mtime tick would go
unseen, as git's "racily clean" entries.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from data.sources.split import DatasetError, UnreadableSample
from data.sources.staging import atomic_file
from data.sources.synthetic import cache_root

log = logging.getLogger(__name__)

IMAGE_SUFFIXES = (".jpeg", ".jpg", ".png")
INDEX_FORMAT = 2  # bump when the saved arrays change, so older indexes are rebuilt (2: each file's size)
RACY_NS = 2_000_000_000  # mtimes closer than this to the scan may hide a change (FAT's resolution is 2 s)
SCAN_THREADS = 16  # class folders listed at once on a network filesystem
Arrays = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # a FolderSplit's names, offsets, labels, sizes
NETWORK_FILESYSTEMS = ("nfs", "nfs4", "lustre", "gpfs", "beegfs", "ceph", "cifs", "smb3", "glusterfs", "9p", "fuse")


@dataclass(frozen=True, eq=False)
class FolderSplit:
    """The images of one split: `split[i] -> (path, label)`, `len(split)`, `split.classes`, `split.read(i)`."""

    directory: str
    names: np.ndarray  # uint8: each file's path relative to `directory`, one after another
    offsets: np.ndarray  # int64, one more than the files: file i's name is names[offsets[i]:offsets[i + 1]]
    labels: np.ndarray  # int16: each file's position in `classes`
    sizes: np.ndarray  # int64: each file's size in bytes when indexed (-1: it could not be stat'ed)
    classes: tuple[str, ...]
    origin: str = ""  # where it was found, for the run's start-up line: "Kaggle layout at ROOT"

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[str, int]:
        index = range(len(self))[index]  # negative indices count from the end; IndexError past it
        name = self.names[self.offsets[index] : self.offsets[index + 1]].tobytes()
        return f"{self.directory}/{os.fsdecode(name)}", int(self.labels[index])

    def read(self, index: int) -> bytes:
        """File `index`'s bytes. One removed, unreadable, or of another size than the index recorded is an
        UnreadableSample that names it and says which."""
        path, indexed = self[index][0], int(self.sizes[index])
        try:
            with open(path, "rb") as file:
                data = file.read()
        except FileNotFoundError:
            gone = "removed since the index was built" if indexed >= 0 else "missing"
            raise UnreadableSample(f"{path}: {gone}") from None
        except OSError as err:
            raise UnreadableSample(f"{path}: {err.strerror or err}") from None
        if indexed >= 0 and len(data) != indexed:
            raise UnreadableSample(f"{path}: {size_change(len(data), indexed)}")
        return data


def size_change(size: int, indexed: int) -> str:
    """Why a file of `size` bytes, indexed at `indexed`, is refused. A smaller file is most often one cut short (a
    copy interrupted, a full disk), but a replacement by a smaller file reads the same."""
    if size < indexed:
        return f"truncated or replaced since the index was built ({size} of {indexed} bytes)"
    return f"replaced since the index was built ({size} bytes, indexed {indexed})"


@dataclass(frozen=True)
class FlatLabels:
    """The classes of images kept in one folder without class folders, read from label files (a CSV, a devkit).

    `wnids()` maps each image's name without its extension to its wnid; `files` are what it reads (a change to
    one rebuilds the index) and the first one names them in messages.
    """

    files: tuple[Path, ...]
    wnids: Callable[[], Mapping[str, str]]


def index_dir() -> Path:
    """Where saved indexes live: ``$RN50PERF_CACHE/index`` (default ``~/.cache/rn50perf/index``)."""
    return cache_root() / "index"


def is_image(name: str) -> bool:
    return name.lower().endswith(IMAGE_SUFFIXES)


def find_classes(train: Path) -> tuple[str, ...]:
    """The class folders of the training split, sorted: class i is classes[i] in every split and layout."""
    if not train.is_dir():
        raise DatasetError(f"{train.parent} has no {train.name}/ folder")
    classes = tuple(sorted(_folders(train)))
    if not classes:
        raise DatasetError(f"{train} has no class folders")
    return classes


def open_split(
    directory: Path,
    classes: tuple[str, ...],
    *,
    labels: FlatLabels | None = None,
    watch: Sequence[Path] = (),
    cache: Path | None = None,
) -> FolderSplit:
    """The images in `directory`'s class folders (or, with `labels`, in `directory` itself), sorted by folder
    then name, labelled by their wnid's position in `classes`.

    With `cache`, the index is saved in that folder and reused while `directory`, its class folders, the label
    files and the `watch` paths (the dataset's root) are unchanged.
    """
    started = time.time_ns()
    if not directory.is_dir():
        raise DatasetError(f"{directory.parent} has no {directory.name}/ folder")
    folders = () if labels else tuple(sorted(_folders(directory)))
    label_files = labels.files if labels else ()
    stamps = _stamps([directory, *watch, *label_files, *(directory / folder for folder in folders)])
    saved = cache / _index_name(directory) if cache else None
    arrays = _load(saved, stamps, classes) if saved else None
    if arrays is None:
        arrays = _scan_flat(directory, labels, classes) if labels else _scan_folders(directory, folders, classes)
        if saved and _settled(stamps, started):
            _save(saved, stamps, classes, arrays)
    _require_images(directory, folders, classes, arrays[2])
    return FolderSplit(str(directory), *arrays, classes)


def _require_images(directory: Path, folders: tuple[str, ...], classes: tuple[str, ...], labels: np.ndarray) -> None:
    """Refuse a class folder without images (a saved index is checked too): training on the other classes alone,
    or evaluating without one, would go unnoticed."""
    counts = dict(zip(classes, np.bincount(labels, minlength=len(classes)).tolist(), strict=True))
    empty = [folder for folder in folders if counts[folder] == 0]
    if empty:
        others = f", nor do {len(empty) - 1} other class folders there" if len(empty) > 1 else ""
        raise DatasetError(
            f"{directory / empty[0]} holds no images ({', '.join(IMAGE_SUFFIXES)}){others}: "
            "add the class's images, or remove the folder"
        )


def _folders(directory: Path) -> list[str]:
    with os.scandir(directory) as entries:
        return [entry.name for entry in entries if entry.is_dir()]


def scan_threads(directory: Path) -> int:
    """How many class folders to list at once: SCAN_THREADS on a network filesystem, where each listing waits on
    a server and threads overlap the waits; one on a local filesystem, where listing cached folders is CPU work
    under the GIL and threads only contend (bench.index: 1.2 s with one, 2.2 s with 16, for 1.33 M files)."""
    kind = filesystem_type(directory)
    return SCAN_THREADS if kind.split(".")[0] in NETWORK_FILESYSTEMS else 1


def filesystem_type(path: Path) -> str:
    """The type of the filesystem holding `path` ("ext4", "nfs4", "fuse.sshfs", ...): its mount in
    /proc/self/mounts whose mount point is the longest prefix of the path; "" where that cannot be read."""
    target = os.path.realpath(path)
    try:
        mounts = [line.split()[1:3] for line in Path("/proc/self/mounts").read_text().splitlines()]
    except OSError:
        return ""
    under = [(point.replace("\\040", " "), kind) for point, kind in mounts]
    above = [(point, kind) for point, kind in under if os.path.commonpath([point, target]) == point]
    return max(above, key=lambda mount: len(mount[0]), default=("", ""))[1]


def _image_names(directory: Path) -> list[tuple[str, int]]:
    """The names of the images in `directory`, sorted, each with the image's size."""
    with os.scandir(directory) as entries:
        return sorted((entry.name, _size(entry)) for entry in entries if is_image(entry.name))


def _size(entry: os.DirEntry[str]) -> int:
    """The size of the file `entry` names (a link's target's), or -1 where it cannot be stat'ed (a broken link, a
    file removed since it was listed): its read will say why."""
    try:
        return entry.stat().st_size
    except OSError:
        return -1


def _scan_folders(directory: Path, folders: tuple[str, ...], classes: tuple[str, ...]) -> Arrays:
    """names, offsets and labels of the images in `directory`/<wnid>/, the class folders listed by threads."""
    label_of = {wnid: label for label, wnid in enumerate(classes)}
    for folder in folders:
        if folder not in label_of:
            raise DatasetError(f"{directory / folder} is a class that the training split does not have")
    names, lengths, sizes = bytearray(), [], []
    with ThreadPoolExecutor(scan_threads(directory)) as pool:
        # Each folder's names join the buffer as soon as they come: no pile of pieces to free (and fragment) later.
        for packed, packed_lengths, packed_sizes in pool.map(
            lambda folder: _pack(directory / folder, f"{folder}/"), folders
        ):
            names += packed
            lengths.append(packed_lengths)
            sizes.append(packed_sizes)
    counts = [len(folder_lengths) for folder_lengths in lengths]
    labels = np.repeat(np.array([label_of[folder] for folder in folders], np.int16), counts)
    return *_arrays(directory, names, lengths), labels, np.concatenate(sizes)


def _scan_flat(directory: Path, labels: FlatLabels, classes: tuple[str, ...]) -> Arrays:
    """names, offsets and labels of the images in `directory` itself, classed by `labels`."""
    label_of = {wnid: label for label, wnid in enumerate(classes)}
    wnid_of = labels.wnids()
    images = _image_names(directory)
    image_labels = np.empty(len(images), np.int16)
    for i, (name, _) in enumerate(images):
        wnid = wnid_of.get(os.path.splitext(name)[0])
        if wnid is None:
            raise DatasetError(f"{directory / name} has no class in {labels.files[0]}")
        if wnid not in label_of:
            raise DatasetError(f"{directory / name} is of class {wnid}, which the training split does not have")
        image_labels[i] = label_of[wnid]
    packed, lengths = _encode([name for name, _ in images])
    return *_arrays(directory, packed, [lengths]), image_labels, _sizes(images)


def _pack(folder: Path, prefix: str) -> tuple[bytes, np.ndarray, np.ndarray]:
    """The images of `folder`: their names under `prefix` packed by _encode, and their sizes."""
    images = _image_names(folder)
    return *_encode([prefix + name for name, _ in images]), _sizes(images)


def _sizes(images: list[tuple[str, int]]) -> np.ndarray:
    return np.fromiter((size for _, size in images), np.int64, len(images))


def _encode(names: list[str]) -> tuple[bytes, np.ndarray]:
    """The names as bytes, one after another, and each one's length."""
    encoded = [os.fsencode(name) for name in names]
    return b"".join(encoded), np.fromiter(map(len, encoded), np.int64, len(encoded))


def _arrays(directory: Path, names: bytes | bytearray, lengths: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The names buffer and its offsets."""
    if not names:
        raise DatasetError(f"{directory} holds no images")
    all_lengths = np.concatenate(lengths)
    offsets = np.zeros(len(all_lengths) + 1, np.int64)
    np.cumsum(all_lengths, out=offsets[1:])
    return np.frombuffer(names, np.uint8), offsets


def _stamps(paths: Iterable[Path]) -> np.ndarray:
    """(inode, mtime in ns, size) of each path: what a saved index must match to be reused."""
    return np.array([(s.st_ino, s.st_mtime_ns, s.st_size) for s in map(os.stat, paths)], np.int64)


def _settled(stamps: np.ndarray, started: int) -> bool:
    """Whether every stamped mtime is older than the scan by RACY_NS: a later change cannot share its tick."""
    return bool(stamps[:, 1].max() < started - RACY_NS)


def _index_name(directory: Path) -> str:
    digest = hashlib.sha256(os.fsencode(directory.resolve())).hexdigest()[:16]
    return f"{directory.name}-{digest}.npys"


def _load(path: Path, stamps: np.ndarray, classes: tuple[str, ...]) -> Arrays | None:
    """The saved names, offsets, labels and sizes, if `path` was made from folders with these stamps and classes."""
    try:
        with open(path, "rb") as file:
            version, saved_stamps, saved_classes = (np.load(file) for _ in range(3))  # in the order _save wrote
            if version != INDEX_FORMAT or not np.array_equal(saved_stamps, stamps) or tuple(saved_classes) != classes:
                return None
            names, offsets, labels, sizes = (np.load(file) for _ in range(4))
            return names, offsets, labels, sizes
    except (OSError, EOFError, ValueError):
        return None


def _save(path: Path, stamps: np.ndarray, classes: tuple[str, ...], arrays: Arrays) -> None:
    """Write the index atomically: ranks starting together never read half of one."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_file(path) as file:
            for array in (np.array(INDEX_FORMAT), stamps, np.array(classes), *arrays):
                np.save(file, array)
    except OSError as err:
        log.warning("could not save the dataset index %s (%s); it is rebuilt at every start", path, err)
