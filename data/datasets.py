"""Open a dataset by name: the embedded synthetic set (generated on first use) or ImageNet on disk, as a folder
tree in any known layout or as indexed tar shards."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from data.config import DataConfig, SyntheticConfig
from data.shards.read import open_shards
from data.shards.write import ensure_shards
from data.sources.folder_index import FolderSplit, find_classes, index_dir, open_split
from data.sources.layouts import find_layout
from data.sources.split import DatasetError, Split
from data.sources.synthetic import default_root, ensure_dataset

IMAGENET_TRAIN_IMAGES, IMAGENET_EVAL_IMAGES = 1_281_167, 50_000


def open_dataset(name: str, root: str | None, synthetic: SyntheticConfig, form: str = "files") -> tuple[Split, Split]:
    """The train and val splits of `name` ("synthetic" or "imagenet"), class indices from train's folders, read
    as `form` says: "files" (a folder tree) or "shards" (ImageNet: `root` holds `python -m data.shards`' output;
    the synthetic set is packed next to its folder on first use).

    ImageNet's layout is recognised from what is at `root` (data.sources.layouts); each split's index is saved in the
    cache and reused while its folders are unchanged.
    """
    if name == "imagenet" and form == "shards":
        return open_shards(Path(str(root)).expanduser())
    train, val = open_files(name, root, synthetic)
    if form == "shards":
        tree = Path(train.directory).parent
        return ensure_shards(train, val, tree.with_name(tree.name + ".shards"), source=str(tree))
    return train, val


def open_files(name: str, root: str | None, synthetic: SyntheticConfig) -> tuple[FolderSplit, FolderSplit]:
    """The folder tree of `name`: the synthetic set, generated first if needed, or ImageNet in any layout."""
    if name == "synthetic":
        try:
            path = ensure_dataset(Path(root).expanduser() if root else default_root(synthetic), synthetic)
        except FileExistsError as err:
            raise DatasetError(f"data.root: {err}") from err
    else:
        path = Path(str(root)).expanduser()
    layout = find_layout(path)
    classes = find_classes(layout.train)
    cache = index_dir()
    train = replace(open_split(layout.train, classes, watch=[layout.root], cache=cache), origin=layout.describe())
    return train, open_split(layout.val, classes, labels=layout.val_labels, watch=[layout.root], cache=cache)


def describe_dataset(train: Split, val: Split) -> str:
    """One line for the run's start: the layout recognised (or tar shards) and the images of each split."""
    counts = f"{len(train):,} training images in {len(train.classes):,} classes, {len(val):,} validation images"
    return f"dataset: {train.origin if isinstance(train, FolderSplit) else 'tar shards'}, {counts}"


def dataset_size(data: DataConfig) -> tuple[int, int, int]:
    """Classes, training and validation images of the configured dataset, without reading it."""
    synthetic = data.synthetic
    if data.name == "imagenet":
        return 1000, IMAGENET_TRAIN_IMAGES, IMAGENET_EVAL_IMAGES
    return synthetic.classes, synthetic.classes * synthetic.train_per_class, synthetic.classes * synthetic.val_per_class
