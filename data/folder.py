"""The ImageNet folder layout: ROOT/{train,val}/<wnid>/<image>, class indices from the sorted train wnids."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

IMAGE_SUFFIXES = {".jpeg", ".jpg", ".png"}


class DatasetError(ValueError):
    """A dataset directory that cannot be used as it is (missing split, no images, unknown class)."""


@dataclass(frozen=True)
class Split:
    """The files of one split and their class indices."""

    paths: tuple[Path, ...]
    labels: tuple[int, ...]
    classes: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.paths)


def find_classes(root: Path) -> tuple[str, ...]:
    train = root / "train"
    if not train.is_dir():
        raise DatasetError(f"{root} has no train/ folder (expected ImageNet layout train/<wnid>/*.JPEG)")
    classes = tuple(sorted(p.name for p in train.iterdir() if p.is_dir()))
    if not classes:
        raise DatasetError(f"{train} has no class folders")
    return classes


def index_split(root: Path, split: str, classes: tuple[str, ...]) -> Split:
    """Every image under ROOT/split/<wnid>/, sorted, labelled by the wnid's position in `classes`."""
    directory = root / split
    if not directory.is_dir():
        raise DatasetError(f"{root} has no {split}/ folder (expected {split}/<wnid>/*.JPEG)")
    label_of = {name: i for i, name in enumerate(classes)}
    paths: list[Path] = []
    labels: list[int] = []
    for class_dir in sorted(p for p in directory.iterdir() if p.is_dir()):
        if class_dir.name not in label_of:
            raise DatasetError(f"{class_dir} is a class that train/ does not have")
        files = sorted(f for f in class_dir.iterdir() if f.suffix.lower() in IMAGE_SUFFIXES)
        paths += files
        labels += [label_of[class_dir.name]] * len(files)
    if not paths:
        raise DatasetError(f"{directory} holds no images")
    return Split(tuple(paths), tuple(labels), classes)
