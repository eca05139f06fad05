"""The ImageNet layouts people have, recognised from what is at the root: torchvision's, Kaggle's, image-net.org's.

All three keep the training images in class folders, train/<wnid>/*.JPEG. The validation images are in class
folders too (as torchvision's `ImageNet` prepares them from the archives), or all in one folder, classed by a
label file:
  - Kaggle's ImageNet Object Localization Challenge: ROOT/ILSVRC/Data/CLS-LOC/{train,val}/, and
    ROOT/LOC_val_solution.csv with rows `ImageId,PredictionString`: the image's name without its extension,
    and "wnid xmin ymin xmax ymax" per bounding box (every box of an image has the image's class).
  - image-net.org's ILSVRC2012 archives unpacked: ROOT/train/<wnid>/ (each class's tar inside
    ILSVRC2012_img_train.tar unpacked into its folder), ROOT/val/ILSVRC2012_val_00000001.JPEG, ... and the devkit
    (ILSVRC2012_devkit_t12/ or its .tar.gz), whose ground truth gives the class of each image in name order.
A validation folder of class folders is read as such in every layout (valprep.sh makes one).
"""

from __future__ import annotations

import csv
import functools
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from data.sources.devkit import devkit_files, val_wnids
from data.sources.folder_index import FlatLabels, is_image
from data.sources.split import DatasetError

KAGGLE_IMAGES = Path("ILSVRC", "Data", "CLS-LOC")
KAGGLE_VAL_LABELS = "LOC_val_solution.csv"
DEVKIT = "ILSVRC2012_devkit_t12"
KNOWN = (
    "torchvision    ROOT/train/<wnid>/*.JPEG, ROOT/val/<wnid>/*.JPEG",
    "Kaggle         ROOT/ILSVRC/Data/CLS-LOC/train/<wnid>/*.JPEG, ROOT/ILSVRC/Data/CLS-LOC/val/*.JPEG, "
    f"ROOT/{KAGGLE_VAL_LABELS}",
    f"image-net.org  ROOT/train/<wnid>/*.JPEG, ROOT/val/ILSVRC2012_val_*.JPEG, ROOT/{DEVKIT}[.tar.gz]",
)
SHOWN_ENTRIES = 8


@dataclass(frozen=True)
class Layout:
    """Where a dataset's splits are: `train` holds class folders; `val` too, unless `val_labels` class it. `name`
    says whose layout it is: torchvision, Kaggle or image-net.org."""

    root: Path
    train: Path
    val: Path
    val_labels: FlatLabels | None = None
    name: str = "torchvision"

    def describe(self) -> str:
        return f"{self.name} layout at {self.root}"


def find_layout(root: Path) -> Layout:
    """The layout of the dataset at `root`; a DatasetError lists the known layouts and what `root` holds."""
    if not root.is_dir():
        raise DatasetError(f"{root} is not a directory (data.root: a dataset in an ImageNet layout)")
    if kaggle := _kaggle_root(root):
        images = kaggle / KAGGLE_IMAGES
        flat = _holds_images(images / "val")
        return Layout(kaggle, images / "train", images / "val", _kaggle_labels(kaggle) if flat else None, "Kaggle")
    train, val = root / "train", root / "val"
    if _holds_folders(train):
        if _holds_images(val):
            return Layout(root, train, val, _devkit_labels(root), "image-net.org")
        return Layout(root, train, val)
    raise DatasetError(_unknown_layout(root))


def kaggle_val_wnids(solution: Path) -> dict[str, str]:
    """ImageId -> wnid from Kaggle's LOC_val_solution.csv (the first word of the PredictionString)."""
    with solution.open(newline="") as file:
        rows = csv.reader(file)
        if next(rows, None) != ["ImageId", "PredictionString"]:
            raise DatasetError(f"{solution} does not start with the header ImageId,PredictionString")
        try:
            return {image: boxes.split()[0] for image, boxes in rows}
        except (ValueError, IndexError):
            raise DatasetError(
                f"{solution}, line {rows.line_num}: not `ImageId,wnid xmin ymin xmax ymax ...`"
            ) from None


def _kaggle_root(root: Path) -> Path | None:
    """The Kaggle download folder that `root` is, or that holds `root` on the way to ILSVRC/Data/CLS-LOC/."""
    root = root.absolute()
    for candidate in (root, *root.parents[: len(KAGGLE_IMAGES.parts)]):
        images = candidate / KAGGLE_IMAGES
        if images.is_relative_to(root) and (images / "train").is_dir():
            return candidate
    return None


def _kaggle_labels(kaggle: Path) -> FlatLabels:
    solution = kaggle / KAGGLE_VAL_LABELS
    if not solution.is_file():
        raise DatasetError(f"{kaggle} is Kaggle's layout without {KAGGLE_VAL_LABELS}, the validation classes")
    return FlatLabels((solution,), functools.partial(kaggle_val_wnids, solution))


def _devkit_labels(root: Path) -> FlatLabels:
    """ILSVRC2012_val_00000001 -> wnid, ... from the devkit's ground truth, which lists them in name order."""
    for devkit in (root / DEVKIT, root / f"{DEVKIT}.tar.gz"):
        if devkit.exists():
            return FlatLabels(devkit_files(devkit), functools.partial(_numbered_val_wnids, devkit))
    raise DatasetError(
        f"{root}/val holds images without class folders (image-net.org's layout), classed by the devkit, "
        f"but neither {root / DEVKIT}/ nor {root / DEVKIT}.tar.gz is there"
    )


def _numbered_val_wnids(devkit: Path) -> dict[str, str]:
    return {f"ILSVRC2012_val_{number:08d}": wnid for number, wnid in enumerate(val_wnids(devkit), start=1)}


def _holds_folders(directory: Path) -> bool:
    return any(entry.is_dir() for entry in _entries(directory))


def _holds_images(directory: Path) -> bool:
    return any(is_image(entry.name) for entry in _entries(directory))


def _entries(directory: Path) -> Iterator[os.DirEntry[str]]:
    """The entries of `directory`, none if it is not a folder."""
    if directory.is_dir():
        with os.scandir(directory) as entries:
            yield from entries


def _unknown_layout(root: Path) -> str:
    lines = [f"{root} is not in an ImageNet layout that this harness knows:", *(f"  {known}" for known in KNOWN)]
    lines.append(f"found in {root}: {_listing(root)}")
    if (root / "train").is_dir():
        lines.append(f"found in {root / 'train'}: {_listing(root / 'train')}")
    return "\n".join(lines)


def _listing(directory: Path) -> str:
    """The first few entries of `directory`, sorted, folders marked with a slash."""
    try:
        with os.scandir(directory) as entries:
            names = sorted(entry.name + "/" * entry.is_dir() for entry in entries)
    except OSError as err:
        return f"nothing ({err.strerror})"
    more = f", ... ({len(names) - SHOWN_ENTRIES} more)" if len(names) > SHOWN_ENTRIES else ""
    return ", ".join(names[:SHOWN_ENTRIES]) + more if names else "nothing"
