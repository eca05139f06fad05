"""The embedded synthetic dataset: layout, JPEG properties, determinism, caching, and that the class is
carried by the object, not by the file size or any single pixel."""

import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, JpegImagePlugin

from configs.checks import ConfigError
from data.config import MAX_CLASSES, SyntheticConfig, validate_synthetic
from data.sources import synthetic
from data.sources.synthetic import class_descriptions, class_names, default_root, ensure_dataset
from tests.user_folder import files

TINY = SyntheticConfig(classes=4, train_per_class=6, val_per_class=3, seed=0)
MODERATE = SyntheticConfig(classes=10, train_per_class=20, val_per_class=10, seed=0)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_dataset(tmp_path_factory.mktemp("tiny") / "data", TINY, workers=1)


@pytest.fixture(scope="module")
def moderate(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_dataset(tmp_path_factory.mktemp("moderate") / "data", MODERATE, workers=2)


def test_imagenet_folder_layout(tiny: Path) -> None:
    names = class_names(TINY)
    assert names == sorted(names) and len(set(names)) == TINY.classes
    assert all(re.fullmatch(r"n0\d{7}", n) for n in names)
    for split, infix, count in (("train", "", TINY.train_per_class), ("val", "_val", TINY.val_per_class)):
        assert sorted(p.name for p in (tiny / split).iterdir()) == names
        for name in names:
            expected = {f"{name}{infix}_{i}.JPEG" for i in range(count)}
            assert {p.name for p in (tiny / split / name).iterdir()} == expected
    mapping = (tiny / "LOC_synset_mapping.txt").read_text().splitlines()
    assert mapping == [f"{n} {d}" for n, d in zip(names, class_descriptions(TINY), strict=True)]
    assert len(set(class_descriptions(TINY))) == TINY.classes
    assert sorted(p.name for p in tiny.iterdir()) == ["LOC_synset_mapping.txt", "spec.json", "train", "val"]


def test_images_are_imagenet_like_jpegs(tiny: Path) -> None:
    paths = sorted(tiny.rglob("*.JPEG"))
    assert len(paths) == TINY.classes * (TINY.train_per_class + TINY.val_per_class)
    shapes = set()
    for path in paths:
        with Image.open(path) as image:
            assert image.format == "JPEG" and image.mode == "RGB"
            assert JpegImagePlugin.get_sampling(image) == 2  # 4:2:0
            assert 300 <= min(image.size) <= 500
            shapes.add(image.size)
            image.load()
        assert 5_000 < path.stat().st_size < 300_000
    assert len(shapes) > len(paths) // 2  # sizes and aspect ratios vary
    assert len({path.read_bytes() for path in paths}) == len(paths)  # train and val images differ too


def test_generation_is_deterministic_and_seeded(tiny: Path, tmp_path: Path) -> None:
    again = files(ensure_dataset(tmp_path / "again", TINY, workers=1))
    assert again == files(tiny)
    other_seed = files(ensure_dataset(tmp_path / "other", SyntheticConfig(4, 6, 3, seed=1), workers=1))
    images = [name for name in again if name.endswith(".JPEG")]
    assert all(other_seed[name] != again[name] for name in images)


def test_worker_pool_gives_the_same_bytes(tiny: Path, tmp_path: Path) -> None:
    assert files(ensure_dataset(tmp_path / "pool", TINY, workers=2)) == files(tiny)


def test_an_image_does_not_depend_on_the_others(tiny: Path, tmp_path: Path) -> None:
    smaller = files(ensure_dataset(tmp_path / "smaller", SyntheticConfig(2, 3, 1, seed=0), workers=1))
    reference = files(tiny)
    shared = [name for name in smaller if name.endswith(".JPEG")]
    assert len(shared) == 2 * (3 + 1)
    assert all(smaller[name] == reference[name] for name in shared)


def test_reuses_a_complete_dataset(tiny: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def stamps() -> dict[Path, int]:
        return {p: p.stat().st_mtime_ns for p in [tiny, *tiny.rglob("*")]}

    def no_rendering(*args: object) -> bytes:
        raise AssertionError("the dataset was rendered again")

    before = stamps()
    monkeypatch.setattr(synthetic, "render_jpeg", no_rendering)
    assert ensure_dataset(tiny, TINY) == tiny
    assert stamps() == before


def test_regenerates_an_outdated_dataset_of_its_own(tiny: Path, tmp_path: Path) -> None:
    root = ensure_dataset(tmp_path / "data", SyntheticConfig(classes=2, train_per_class=2, val_per_class=1, seed=0))
    assert ensure_dataset(root, TINY, workers=1) == root
    assert files(root) == files(tiny)
    assert [p.name for p in tmp_path.iterdir()] == ["data"]  # no staging directory left behind


def test_generates_into_an_empty_folder(tiny: Path, tmp_path: Path) -> None:
    assert ensure_dataset(tmp_path, TINY, workers=1) == tmp_path
    assert files(tmp_path) == files(tiny)


def test_an_interrupted_generation_leaves_no_dataset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    render = synthetic.render_jpeg
    calls = []

    def render_then_fail(*args: object) -> bytes:
        calls.append(args)
        if len(calls) > 5:
            raise KeyboardInterrupt
        return render(*args)

    monkeypatch.setattr(synthetic, "render_jpeg", render_then_fail)
    with pytest.raises(KeyboardInterrupt):
        ensure_dataset(tmp_path / "data", TINY, workers=1)
    assert list(tmp_path.iterdir()) == []


def user_folder(root: Path) -> dict[str, bytes]:
    """A user's own images in the layout the README asks for (DIR/train/<class>/, DIR/val/<class>/); their bytes."""
    for split, count in (("train", 3), ("val", 1)):
        for name in ("cat", "dog"):
            (root / split / name).mkdir(parents=True)
            for i in range(count):
                (root / split / name / f"IMG_{i:04d}.jpg").write_bytes(f"{split} {name} {i}".encode())
    return files(root)


def test_refuses_a_folder_of_the_users_images_and_names_the_fix(tmp_path: Path) -> None:
    before = user_folder(tmp_path)
    with pytest.raises(FileExistsError, match=r"holds images of its own \(train/\).* give data=imagenet"):
        ensure_dataset(tmp_path, TINY, workers=1)
    assert files(tmp_path) == before


@pytest.mark.parametrize(
    "damage",
    [
        "the marker gone",  # an old generator's folder, or a user's that looks like one: not recognisably ours
        "a file of the user's added to an outdated dataset",
        "a marker that is not the generator's",
    ],
)
def test_never_replaces_a_folder_it_cannot_tell_is_its_own(tmp_path: Path, damage: str) -> None:
    root = ensure_dataset(tmp_path / "data", SyntheticConfig(classes=2, train_per_class=2, val_per_class=1, seed=0))
    if damage == "the marker gone":
        (root / "spec.json").unlink()
    elif damage == "a marker that is not the generator's":
        (root / "spec.json").write_text('{"experiment": "mine"}')
    else:
        (root / "train" / "n09000000" / "holiday.jpg").write_bytes(b"the user's photo")
    before = files(root)
    with pytest.raises(FileExistsError, match=r"rn50perf's synthetic set|did not write"):
        ensure_dataset(root, TINY, workers=1)
    assert files(root) == before


def test_refuses_to_replace_a_directory_that_is_not_a_dataset(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match=r"did not write.*give another data\.root"):
        ensure_dataset(tmp_path, TINY, workers=1)
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_default_root_is_per_spec_under_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RN50PERF_CACHE", str(tmp_path))
    root = default_root(TINY)
    assert root.parent == tmp_path and root.name.startswith("synthetic-")
    assert default_root(SyntheticConfig(4, 6, 3, seed=0)) == root
    assert default_root(SyntheticConfig(4, 6, 3, seed=1)) != root
    monkeypatch.delenv("RN50PERF_CACHE")
    assert default_root(TINY) == Path.home() / ".cache" / "rn50perf" / root.name


def test_invalid_sets_are_refused_by_the_one_check_of_the_data_section() -> None:
    for bad in ({"classes": 1}, {"classes": MAX_CLASSES + 1}, {"train_per_class": 0}):
        with pytest.raises(ConfigError, match=r"^data\.synthetic\."):
            validate_synthetic(SyntheticConfig(**bad))


def test_the_config_knows_how_many_classes_the_generator_can_draw() -> None:
    """data/config.py states MAX_CLASSES without importing the generator: one class per (shape, hue, texture)."""
    factors = synthetic._class_factors()
    assert len(factors) == len(set(factors)) == MAX_CLASSES


Features = Callable[[Path], np.ndarray | list[float]]


def load_split(root: Path, split: str, features: Features) -> tuple[np.ndarray, np.ndarray]:
    """features(path) of every image of the split, and the labels."""
    rows, labels = [], []
    for label, name in enumerate(class_names(MODERATE)):
        for path in sorted((root / split / name).iterdir()):
            rows.append(features(path))
            labels.append(label)
    return np.array(rows, dtype=np.float64), np.array(labels)


def nearest_class_mean_accuracy(root: Path, features: Features) -> float:
    """Val accuracy of the classifier that picks the class whose mean train feature vector is nearest.
    Features may have leading axes (e.g. pixel positions): one accuracy per position, the best returned."""
    x_train, y_train = load_split(root, "train", features)
    x_val, y_val = load_split(root, "val", features)
    means = np.stack([x_train[y_train == c].mean(axis=0) for c in range(MODERATE.classes)])  # (C, ..., F)
    distances = ((x_val[:, None] - means[None]) ** 2).sum(axis=-1)  # (N, C, ...)
    accuracy = (distances.argmin(axis=1) == y_val.reshape(-1, *[1] * (distances.ndim - 2))).mean(axis=0)
    return float(np.max(accuracy))


def thumbnail(path: Path, side: int) -> np.ndarray:
    with Image.open(path) as image:
        return np.asarray(image.resize((side, side), Image.Resampling.BOX), dtype=np.float64)


def file_size(path: Path) -> list[float]:
    return [path.stat().st_size]


def bytes_per_pixel(path: Path) -> list[float]:
    """The file size without the image dimensions, which could hide a class-dependent compressibility."""
    with Image.open(path) as image:
        return [path.stat().st_size / (image.width * image.height)]


@pytest.mark.parametrize("feature", [file_size, bytes_per_pixel], ids=["file size", "bytes per pixel"])
def test_file_size_does_not_give_the_class_away(moderate: Path, feature: Features) -> None:
    accuracy = nearest_class_mean_accuracy(moderate, feature)
    print(f"{feature.__name__} nearest-class-mean accuracy: {accuracy:.2f} (chance 0.10)")
    assert accuracy < 0.3


def test_no_single_pixel_gives_the_class_away(moderate: Path) -> None:
    accuracy = nearest_class_mean_accuracy(moderate, lambda path: thumbnail(path, 16))  # (16, 16, RGB)
    print(f"best single-pixel nearest-class-mean accuracy: {accuracy:.2f} (chance 0.10)")
    assert accuracy < 0.35


def test_the_object_carries_the_class(moderate: Path) -> None:
    """A positive control for the two tests above: a crude global feature, the histogram of the hues of
    saturated pixels, already separates the classes well above chance."""

    def saturated_hues(path: Path) -> np.ndarray:
        hsv = np.asarray(Image.fromarray(thumbnail(path, 64).astype(np.uint8)).convert("HSV"))
        hues = hsv[..., 0][(hsv[..., 1] > 128) & (hsv[..., 2] > 64)]
        return np.histogram(hues, bins=16, range=(0, 256))[0] / hsv[..., 0].size

    accuracy = nearest_class_mean_accuracy(moderate, saturated_hues)
    print(f"saturated-hue histogram nearest-class-mean accuracy: {accuracy:.2f} (chance 0.10)")
    assert accuracy > 0.45
