"""Open a dataset by name: the embedded synthetic set (generated on first use) or ImageNet on disk."""

from __future__ import annotations

from pathlib import Path

from data.folder import DatasetError, Split, find_classes, index_split
from data.synthetic import SyntheticSpec, default_root, ensure_dataset


def open_dataset(name: str, root: str | None, synthetic: SyntheticSpec) -> tuple[Split, Split]:
    """The train and val splits of `name` ("synthetic" or "imagenet"), class indices from train's folders."""
    if name == "synthetic":
        try:
            path = ensure_dataset(Path(root).expanduser() if root else default_root(synthetic), synthetic)
        except FileExistsError as err:
            raise DatasetError(f"data.root: {err}") from err
    else:
        path = Path(str(root)).expanduser()
    classes = find_classes(path)
    return index_split(path, "train", classes), index_split(path, "val", classes)
