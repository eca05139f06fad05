"""ImageNet in the layouts people have (torchvision's, Kaggle's, image-net.org's), each recognised without flags and
labelled alike, and the saved index that a second start reads instead of listing the tree again."""

from __future__ import annotations

import logging
import os
import tarfile
import time
from pathlib import Path

import pytest

from data.config import SyntheticConfig
from data.datasets import describe_dataset, open_dataset
from data.sources import folder_index
from data.sources.devkit import write_devkit
from data.sources.split import DatasetError, Split
from data.sources.synthetic import CACHE_ENV
from tests import user_folder
from tests.conftest import configured_dataset
from tests.jpeg_samples import jpeg

WNIDS = ("n01440764", "n01443537", "n01484850")  # sorted: class i is WNIDS[i]
TRAIN_PER_CLASS = 2
VAL_WNIDS = ("n01484850", "n01440764", "n01443537", "n01440764", "n01484850")  # of ILSVRC2012_val_00000001, ...
KAGGLE_IMAGES = Path("ILSVRC", "Data", "CLS-LOC")
DEVKIT = "ILSVRC2012_devkit_t12"


def image(number: int) -> bytes:
    """A tiny JPEG whose bytes differ with `number`, so that a sample's bytes say which image it is."""
    return jpeg("baseline-420", 8, 8 + number)


def train_images() -> dict[str, tuple[str, bytes]]:
    names = [f"{wnid}_{i}.JPEG" for wnid in WNIDS for i in range(TRAIN_PER_CLASS)]
    return {name: (name.split("_")[0], image(number)) for number, name in enumerate(names)}


def val_images(wnids: tuple[str, ...] = VAL_WNIDS) -> dict[str, tuple[str, bytes]]:
    return {f"ILSVRC2012_val_{n:08d}.JPEG": (wnid, image(100 + n)) for n, wnid in enumerate(wnids, start=1)}


def write(path: Path, data: bytes | str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    path.write_bytes(data)


def write_layout(root: Path, layout: str, val_wnids: tuple[str, ...] = VAL_WNIDS) -> Path:
    """The miniature dataset at `root` in `layout`: kaggle, imagenet_org (devkit folder), imagenet_org_tar, or
    torchvision (validation images in class folders, as torchvision's ImageNet moves them)."""
    images = root / KAGGLE_IMAGES if layout == "kaggle" else root
    for name, (wnid, data) in train_images().items():
        write(images / "train" / wnid / name, data)
    for name, (wnid, data) in val_images(val_wnids).items():
        write(images / "val" / (f"{wnid}/{name}" if layout == "torchvision" else name), data)
    if layout == "kaggle":  # Kaggle's rows are in no particular order; every box of an image has its class
        rows = [
            f"{Path(name).stem},{wnid} 10 20 30 40 {wnid} 5 6 7 8 \n"
            for name, (wnid, _) in val_images(val_wnids).items()
        ]
        write(root / "LOC_val_solution.csv", "ImageId,PredictionString\n" + "".join(reversed(rows)))
        write(root / "LOC_synset_mapping.txt", "".join(f"{wnid} class {wnid}\n" for wnid in WNIDS))
    synsets = sorted({*WNIDS, *val_wnids}, reverse=True)  # the devkit's ids are not in wnid order
    if layout == "imagenet_org":
        write_devkit(root / DEVKIT, synsets, list(val_wnids))
    if layout == "imagenet_org_tar":
        write_devkit(root.parent / "devkit", synsets, list(val_wnids))
        with tarfile.open(root / f"{DEVKIT}.tar.gz", "w:gz") as archive:
            archive.add(root.parent / "devkit", arcname=DEVKIT)
    return root


def backdate(root: Path) -> None:
    """Date every folder and label file a minute back, as a tree copied earlier (an index is saved only for a tree
    that has not changed in the last few seconds)."""
    when = time.time() - 60
    for directory, _, files in os.walk(root):
        for path in [directory, *(os.path.join(directory, name) for name in files if not folder_index.is_image(name))]:
            os.utime(path, (when, when))


def samples(split: Split) -> dict[str, tuple[int, bytes]]:
    """Each sample's file name -> (label, bytes)."""
    return {Path(split[i][0]).name: (split[i][1], split.read(i)) for i in range(len(split))}


def expected(images: dict[str, tuple[str, bytes]]) -> dict[str, tuple[int, bytes]]:
    return {name: (WNIDS.index(wnid), data) for name, (wnid, data) in images.items()}


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def imagenet(root: Path) -> tuple[Split, Split]:
    return open_dataset("imagenet", str(root), SyntheticConfig())


@pytest.mark.parametrize(
    ("layout", "opened"),
    [
        ("torchvision", "."),
        ("kaggle", "."),
        ("kaggle", "ILSVRC"),
        ("kaggle", "ILSVRC/Data/CLS-LOC"),
        ("imagenet_org", "."),
        ("imagenet_org_tar", "."),
    ],
)
def test_every_layout_gives_the_same_samples_and_labels(tmp_path, layout, opened):
    root = write_layout(tmp_path / "imagenet", layout)
    train, val = imagenet(root / opened)
    assert train.classes == val.classes == WNIDS
    assert [Path(train[i][0]).name for i in range(len(train))] == list(train_images())  # by class, then name
    assert samples(train) == expected(train_images())
    assert samples(val) == expected(val_images())


@pytest.mark.parametrize(
    ("layout", "name", "opened"),
    [("torchvision", "torchvision", "."), ("kaggle", "Kaggle", "ILSVRC"), ("imagenet_org", "image-net.org", ".")],
)
def test_the_start_up_line_names_the_layout_and_counts_the_images(tmp_path, layout, name, opened):
    root = write_layout(tmp_path / "imagenet", layout)
    line = describe_dataset(*imagenet(root / opened))
    assert line == f"dataset: {name} layout at {root}, 6 training images in 3 classes, 5 validation images"


@pytest.mark.parametrize("layout", ["kaggle", "imagenet_org"])
def test_a_validation_image_of_a_class_that_train_lacks_is_refused_by_name(tmp_path, layout):
    root = write_layout(tmp_path / "imagenet", layout, val_wnids=("n09999999", *VAL_WNIDS[1:]))
    with pytest.raises(DatasetError, match=r"ILSVRC2012_val_00000001\.JPEG is of class n09999999"):
        imagenet(root)


def test_flat_validation_images_without_the_devkit_say_where_it_should_be(tmp_path):
    root = write_layout(tmp_path / "imagenet", "imagenet_org")
    os.rename(root / DEVKIT, tmp_path / "elsewhere")
    with pytest.raises(DatasetError, match=f"{DEVKIT}/ nor .*{DEVKIT}.tar.gz"):
        imagenet(root)


def test_an_unknown_layout_is_refused_with_the_layouts_known_and_what_is_there(tmp_path):
    (tmp_path / "photos").mkdir()
    (tmp_path / "notes.txt").write_text("")
    with pytest.raises(DatasetError) as refused:
        imagenet(tmp_path)
    message = str(refused.value)
    for layout in ("torchvision", "Kaggle", "image-net.org"):
        assert f"\n  {layout} " in message
    for shape in ("ROOT/val/<wnid>/*.JPEG", "ROOT/LOC_val_solution.csv", f"ROOT/{DEVKIT}[.tar.gz]"):
        assert shape in message
    assert message.endswith(f"found in {tmp_path}: notes.txt, photos/")
    with pytest.raises(DatasetError, match="missing is not a directory"):
        imagenet(tmp_path / "missing")


def test_a_configured_root_in_no_layout_is_refused_with_what_is_there(tmp_path):
    """image-net.org's train tar unpacked once: one tar per class, not yet class folders."""
    for wnid in WNIDS:
        write(tmp_path / "imagenet" / "train" / f"{wnid}.tar", b"")
    write(tmp_path / "imagenet" / "val" / "ILSVRC2012_val_00000001.JPEG", image(0))
    with pytest.raises(DatasetError) as refused:
        configured_dataset("data.name=imagenet", f"data.root={tmp_path / 'imagenet'}")
    assert "not in an ImageNet layout" in str(refused.value)
    assert f"found in {tmp_path / 'imagenet' / 'train'}: n01440764.tar, n01443537.tar" in str(refused.value)


def test_a_second_start_reads_the_saved_index_until_the_tree_changes(tmp_path, cache, monkeypatch):
    root = write_layout(tmp_path / "imagenet", "kaggle")
    backdate(root)
    first = [samples(split) for split in imagenet(root)]
    assert len(list(cache.glob("index/*.npys"))) == 2
    with monkeypatch.context() as patch:
        patch.setattr(folder_index, "_image_names", lambda directory: pytest.fail(f"listed {directory} again"))
        assert [samples(split) for split in imagenet(root)] == first

    added = root / KAGGLE_IMAGES / "train" / WNIDS[1] / "added.JPEG"
    added.write_bytes(image(50))
    train, _ = imagenet(root)
    assert samples(train) == {**first[0], "added.JPEG": (1, image(50))}

    solution = root / "LOC_val_solution.csv"
    solution.write_text(solution.read_text().replace(f"00000002,{WNIDS[0]}", f"00000002,{WNIDS[2]}"))
    _, val = imagenet(root)
    assert samples(val)["ILSVRC2012_val_00000002.JPEG"][0] == 2


@pytest.mark.parametrize("layout", ["torchvision", "kaggle", "imagenet_org", "imagenet_org_tar"])
def test_opening_a_dataset_changes_none_of_its_files_and_writes_only_the_index_into_the_cache(tmp_path, layout):
    backdate(write_layout(tmp_path / "imagenet", layout))
    before = user_folder.files(tmp_path)  # the dataset, and the devkit beside it
    imagenet(tmp_path / "imagenet")
    after = user_folder.files(tmp_path)
    assert {name: data for name, data in after.items() if not name.startswith("cache/")} == before
    assert [Path(name).parent for name in after if name.startswith("cache/")] == [Path("cache/index")] * 2


def test_an_unwritable_cache_only_costs_a_warning(tmp_path, monkeypatch, caplog):
    root = write_layout(tmp_path / "imagenet", "torchvision")
    backdate(root)
    (tmp_path / "not-a-folder").write_text("")
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "not-a-folder"))
    with caplog.at_level(logging.WARNING, logger="data.sources.folder_index"):
        train, val = imagenet(root)
    assert samples(train) == expected(train_images()) and samples(val) == expected(val_images())
    assert "could not save the dataset index" in caplog.text
