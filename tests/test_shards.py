"""Indexed tar shards: packing from folders and from image-net.org's archives, resuming, checking, and reading
them for training (every epoch a full pass over all samples, in a fresh order)."""

from __future__ import annotations

import hashlib
import io
import json
import multiprocessing
import os
import pickle
import signal
import subprocess
import sys
import tarfile
from functools import partial
from pathlib import Path

import pytest
import torch
import webdataset

from data.config import SyntheticConfig
from data.datasets import open_dataset
from data.loading.loader import Crops, build_loader
from data.loading.sampler import ShardedSampler
from data.shards.__main__ import main
from data.shards.read import ShardSplit, open_shards
from data.shards.write import ensure_shards, open_archives, pack
from data.sources.devkit import write_devkit
from data.sources.split import DatasetError, Split
from tests.conftest import ALL_EPOCHS, REPO, run_train
from tests.jpeg_samples import jpeg, png
from tests.user_folder import files, plant

WNIDS = ("n01", "n02", "n03")
SHARD_SIZE = 8000  # two or three tiny images per shard, so that every split spans several shards


def image(number: int) -> bytes:
    """A tiny JPEG whose bytes differ with `number` (its width does)."""
    return jpeg("baseline-420", 20, 24 + number)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """ImageNet's folder layout, 3 classes: 15 train and 6 val images, among them a PNG named .JPEG, a name with
    dots, and a file name that two classes use (keys must stay unique)."""
    root = tmp_path / "tree"
    per_class = {"train": 4, "val": 2}
    names = [f"{split}/{wnid}/{wnid}_{i}.JPEG" for split, n in per_class.items() for wnid in WNIDS for i in range(n)]
    for number, name in enumerate([*names, "train/n02/n01_0.JPEG", "train/n03/photo.v2.JPEG"]):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(image(number))
    (root / "train/n03/mislabelled.JPEG").write_bytes(png(20, 30))
    return root


def folder_splits(root: Path) -> dict[str, Split]:
    train, val = open_dataset("imagenet", str(root), SyntheticConfig())
    return {"train": train, "val": val}


def samples(split: Split) -> list[tuple[int, bytes]]:
    return [(split[i][1], split.read(i)) for i in range(len(split))]


def test_packed_shards_read_back_every_sample_byte_for_byte(tree, tmp_path):
    sources = folder_splits(tree)
    manifest = pack(sources, tmp_path / "shards", shard_size=SHARD_SIZE)
    train, val = open_shards(tmp_path / "shards")
    assert isinstance(train, ShardSplit) and train.classes == val.classes == WNIDS
    assert samples(train) == samples(sources["train"]) and samples(val) == samples(sources["val"])
    names = [train[i][0] for i in range(len(train))]
    last_shard = len(manifest["splits"]["train"]["shards"]) - 1
    assert names[0] == "train-000000.tar:n01_0.jpg" and names[-1].startswith(f"train-{last_shard:06d}.tar:")
    keys = [name.split(":")[1] for name in names]
    assert len(set(keys)) == len(keys) and {"n01_0_1.jpg", "photo_v2.jpg"} <= set(keys)
    assert pickle.loads(pickle.dumps(train)).read(3) == sources["train"].read(3)  # as a spawned worker reads it


def test_the_manifest_lists_classes_counts_and_each_shards_sha256_and_is_all_that_is_left(tree, tmp_path):
    out = tmp_path / "shards"
    manifest = pack(folder_splits(tree), out, shard_size=SHARD_SIZE)
    assert json.loads((out / "manifest.json").read_text()) == manifest and manifest["classes"] == list(WNIDS)
    names = ["manifest.json", "train.index.npz", "val.index.npz"]
    for split, count in (("train", 15), ("val", 6)):
        entry = manifest["splits"][split]
        assert entry["count"] == count == sum(shard["count"] for shard in entry["shards"])
        assert len(entry["shards"]) > 2
        for number, shard in enumerate(entry["shards"]):
            data = (out / shard["name"]).read_bytes()
            assert shard["name"] == f"{split}-{number:06d}.tar"
            assert shard["bytes"] == len(data) <= SHARD_SIZE
            assert shard["sha256"] == hashlib.sha256(data).hexdigest()
            names.append(shard["name"])
    assert sorted(path.name for path in out.iterdir()) == sorted(names)


def test_webdataset_reads_the_shards_as_samples_with_keys_jpg_and_cls(tree, tmp_path):
    source = folder_splits(tree)["train"]
    pack(folder_splits(tree), tmp_path / "shards", shard_size=SHARD_SIZE)
    train, _ = open_shards(tmp_path / "shards")
    urls = sorted(str(path) for path in (tmp_path / "shards").glob("train-*.tar"))
    read = list(webdataset.WebDataset(urls, shardshuffle=False))
    assert [sample["__key__"] for sample in read] == [train[i][0].split(":")[1][: -len(".jpg")] for i in range(15)]
    assert [(int(sample["cls"]), sample["jpg"]) for sample in read] == samples(source)


class Interrupted:
    """A split whose `after`-th read is interrupted, as Ctrl-C would."""

    def __init__(self, split: Split, after: int) -> None:
        self.split, self.after, self.classes = split, after, split.classes

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, index: int) -> tuple[str, int]:
        return self.split[index]

    def read(self, index: int) -> bytes:
        self.after -= 1
        if self.after < 0:
            self.interrupt()
        return self.split.read(index)

    def interrupt(self) -> None:
        raise KeyboardInterrupt


class Killed(Interrupted):
    """A split whose `after`-th read kills the process, as SIGKILL or the OOM killer would: no cleanup runs."""

    def interrupt(self) -> None:
        os.kill(os.getpid(), signal.SIGKILL)


def interrupt_pack(sources: dict[str, Split], out: Path, after: int = 7) -> None:
    with pytest.raises(KeyboardInterrupt):
        pack({**sources, "train": Interrupted(sources["train"], after)}, out, shard_size=SHARD_SIZE)


def test_a_pack_killed_in_the_middle_of_a_shard_leaves_nothing_behind_once_resumed(tree, tmp_path):
    sources = folder_splits(tree)
    reference, out = tmp_path / "reference", tmp_path / "killed"
    pack(sources, reference, shard_size=SHARD_SIZE)
    killed = {**sources, "train": Killed(sources["train"], 7)}
    packer = multiprocessing.get_context("fork").Process(target=partial(pack, killed, out, shard_size=SHARD_SIZE))
    packer.start()
    packer.join()
    assert packer.exitcode == -signal.SIGKILL
    pack(sources, out, shard_size=SHARD_SIZE)
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in reference.iterdir())


@pytest.mark.parametrize("damage_the_first_shard", [False, True])
def test_an_interrupted_pack_resumes_to_the_shards_of_an_uninterrupted_one(tree, tmp_path, damage_the_first_shard):
    sources = folder_splits(tree)
    reference, out = tmp_path / "reference", tmp_path / "resumed"
    pack(sources, reference, shard_size=SHARD_SIZE)
    interrupt_pack(sources, out)
    first = out / "train-000000.tar"
    assert (out / "train-000001.tar").is_file() and not (out / "manifest.json").exists()
    if damage_the_first_shard:
        first.write_bytes(first.read_bytes().replace(b"JFIF", b"JFIG", 1))
    inode = first.stat().st_ino

    pack(sources, out, shard_size=SHARD_SIZE)
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in reference.iterdir())
    for path in reference.iterdir():
        assert (out / path.name).read_bytes() == path.read_bytes(), path.name
    assert (first.stat().st_ino != inode) == damage_the_first_shard  # a shard that still matches is not rewritten


def test_a_pack_resumed_with_another_shard_size_or_into_a_full_directory_is_refused(tree, tmp_path):
    sources = folder_splits(tree)
    interrupt_pack(sources, tmp_path / "shards")
    with pytest.raises(DatasetError, match="unfinished pack of other samples or with another shard size"):
        pack(sources, tmp_path / "shards", shard_size=2 * SHARD_SIZE)
    with pytest.raises(DatasetError, match="exists and is not empty"):
        pack(sources, tree, shard_size=SHARD_SIZE)


def test_a_source_file_that_cannot_be_read_is_named(tree, tmp_path):
    sources = folder_splits(tree)
    (tree / "train/n02/n02_1.JPEG").unlink()  # gone after the dataset was indexed
    with pytest.raises(DatasetError, match=r"cannot read .*n02_1\.JPEG"):
        pack(sources, tmp_path / "shards", shard_size=SHARD_SIZE)


def test_check_finds_a_corrupted_shard_by_its_hash_while_opening_stays_cheap(tree, tmp_path, capsys):
    out = tmp_path / "shards"
    pack(folder_splits(tree), out, shard_size=SHARD_SIZE)
    assert main(["--check", str(out)]) == 0
    shard = out / "train-000001.tar"
    data = bytearray(shard.read_bytes())
    data[700] ^= 0x01
    shard.write_bytes(data)
    open_shards(out)  # the size still matches: opening does not read the shards
    capsys.readouterr()
    assert main(["--check", str(out)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "train-000001.tar" in error and "sha256" in error


def test_opening_refuses_a_truncated_shard_by_name(tree, tmp_path):
    out = tmp_path / "shards"
    pack(folder_splits(tree), out, shard_size=SHARD_SIZE)
    shard = out / "val-000001.tar"
    shard.write_bytes(shard.read_bytes()[:-1024])
    with pytest.raises(DatasetError, match=r"shard .*val-000001\.tar has \d+ bytes, the manifest says"):
        open_shards(out)


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("missing", "is not a directory"),
        ("folder dataset", "is not a shard directory: it has no manifest.json"),
        ("unfinished pack", "was packed by a run that did not finish"),
    ],
)
def test_what_is_not_a_finished_pack_is_refused_with_the_reason(tree, tmp_path, case, message):
    directory = {"missing": tmp_path / "nowhere", "folder dataset": tree, "unfinished pack": tmp_path / "shards"}[case]
    if case == "unfinished pack":
        interrupt_pack(folder_splits(tree), directory)
    with pytest.raises(DatasetError, match=message):
        open_shards(directory)


def test_the_command_line_packs_and_reports_bad_input_in_one_line_with_status_2(tree, tmp_path):
    def shards(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "data.shards", *args], cwd=REPO, capture_output=True, text=True)

    out = tmp_path / "shards"
    packed = shards("--root", str(tree), "--out", str(out), "--shard-size", "8KB")
    assert packed.returncode == 0, packed.stderr
    assert "packed 15 train and 6 val samples into" in packed.stdout
    assert samples(open_shards(out)[0]) == samples(folder_splits(tree)["train"])
    refused = shards("--root", str(tree), "--out", str(tmp_path))
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert refused.stderr.startswith(f"error: {tmp_path} exists and is not empty")
    assert main(["--root", str(tree), "--out", str(out)]) == 0  # already packed: nothing to do


@pytest.mark.parametrize(
    ("names", "message"),
    [
        (("notes.txt", "train-000000.tar"), "exists and is not empty"),
        (("manifest.json", "photos/IMG_0001.jpg"), "manifest.json is unreadable"),
    ],
)
def test_a_users_folder_given_as_out_is_refused_and_left_as_it_was(tree, tmp_path, capsys, names, message):
    out = tmp_path / "mine"
    planted = plant(out, *names)  # the user's files, one named as a pack names its own
    assert main(["--root", str(tree), "--out", str(out)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and message in error
    assert files(out) == planted


@pytest.mark.parametrize("out", [".", "shards", "train/shards"])
def test_out_in_the_dataset_itself_is_refused_before_anything_is_written(tree, capsys, out):
    before = files(tree)
    assert main(["--root", str(tree), "--out", str(tree / out)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "is inside the dataset" in error
    assert files(tree) == before
    assert out == "." or not (tree / out).exists()


def test_a_resumed_pack_removes_only_its_own_files_and_keeps_the_users(tree, tmp_path):
    sources = folder_splits(tree)
    out = tmp_path / "shards"
    interrupt_pack(sources, out)
    planted = plant(out, "notes.txt", ".packing/notes.txt")
    with pytest.raises(OSError, match="not empty"):  # the pack is complete; the note keeps its work folder
        pack(sources, out, shard_size=SHARD_SIZE)
    assert open_shards(out) and files(out).items() >= planted.items()
    assert [path.name for path in (out / ".packing").iterdir()] == ["notes.txt"]


def test_ensure_shards_replaces_a_pack_of_its_own_alone_never_a_users_files(tree, tmp_path):
    sources = folder_splits(tree)
    users = tmp_path / "photos.shards"  # where the packed set would go: the user's folder, with a manifest.json
    planted = plant(users, "manifest.json", "holiday/IMG_0001.jpg")
    with pytest.raises(DatasetError, match=r"is not a pack of `python -m data\.shards` alone"):
        ensure_shards(sources["train"], sources["val"], users, shard_size=SHARD_SIZE)
    assert files(users) == planted
    ours = tmp_path / "synthetic.shards"
    ensure_shards(sources["train"], sources["val"], ours, shard_size=SHARD_SIZE)
    (ours / "train-000000.tar").write_bytes(b"")  # damaged, and so to be replaced, but for the user's file beside it
    plant(ours, "notes.txt")
    before = files(ours)
    with pytest.raises(DatasetError, match="refusing to replace it"):
        ensure_shards(sources["train"], sources["val"], ours, shard_size=SHARD_SIZE)
    assert files(ours) == before


def tar_of(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def write_archives(directory: Path) -> dict[str, list[tuple[int, bytes]]]:
    """Miniature image-net.org archives: a train tar of class tars and a flat val tar, both out of wnid and name
    order, and the devkit as .tar.gz, its synsets out of wnid order too. Returns each split's (label, bytes) in
    archive order, the order they are packed in."""
    order = {"n02": (2, 0, 1), "n03": (1, 2, 0), "n01": (0, 2, 1)}
    class_tars = {wnid: {f"{wnid}_{i}.JPEG": image(10 * WNIDS.index(wnid) + i) for i in order[wnid]} for wnid in order}
    train_tar = tar_of({f"{wnid}.tar": tar_of(images) for wnid, images in class_tars.items()})
    (directory / "ILSVRC2012_img_train.tar").write_bytes(train_tar)
    val_classes = ["n03", "n01", "n02", "n01", "n03"]
    val = {f"ILSVRC2012_val_{n + 1:08d}.JPEG": (wnid, image(50 + n)) for n, wnid in enumerate(val_classes)}
    stored = dict(reversed(val.items()))
    (directory / "ILSVRC2012_img_val.tar").write_bytes(tar_of({name: data for name, (_, data) in stored.items()}))
    write_devkit(directory / "devkit", ["n03", "n01", "n02"], val_classes)
    with tarfile.open(directory / "ILSVRC2012_devkit_t12.tar.gz", "w:gz") as archive:
        archive.add(directory / "devkit", arcname="ILSVRC2012_devkit_t12")
    return {
        "train": [(WNIDS.index(wnid), data) for wnid, images in class_tars.items() for data in images.values()],
        "val": [(WNIDS.index(wnid), data) for wnid, data in stored.values()],
    }


def test_image_net_archives_pack_without_unpacking(tmp_path):
    archives, out = tmp_path / "archives", tmp_path / "shards"
    archives.mkdir()
    expected = write_archives(archives)
    assert main(["--archives", str(archives), "--out", str(out), "--shard-size", str(SHARD_SIZE)]) == 0
    train, val = open_shards(out)
    assert train.classes == WNIDS and samples(train) == expected["train"] and samples(val) == expected["val"]
    assert train[0][0] == "train-000000.tar:n02_2.jpg" and val[0][0] == "val-000000.tar:ILSVRC2012_val_00000005.jpg"
    (archives / "ILSVRC2012_devkit_t12.tar.gz").unlink()
    with pytest.raises(DatasetError, match=r"lacks ILSVRC2012_devkit_t12\.tar\.gz"):
        open_archives(archives)


def test_ensure_shards_packs_once_and_replaces_a_damaged_pack(tree, tmp_path):
    sources = folder_splits(tree)
    out = tmp_path / "cache" / "synthetic.shards"
    train, _ = ensure_shards(sources["train"], sources["val"], out, shard_size=SHARD_SIZE)
    assert samples(train) == samples(sources["train"])
    manifest = out / "manifest.json"
    inode = manifest.stat().st_ino
    ensure_shards(sources["train"], sources["val"], out, shard_size=SHARD_SIZE)
    assert manifest.stat().st_ino == inode  # already packed: opened, not packed again
    (out / "train-000000.tar").write_bytes(b"")
    train, _ = ensure_shards(sources["train"], sources["val"], out, shard_size=SHARD_SIZE)
    assert manifest.stat().st_ino != inode and samples(train) == samples(sources["train"])
    assert [path.name for path in out.parent.iterdir()] == ["synthetic.shards"]  # no staging directory left
    with pytest.raises(DatasetError, match="refusing to replace it"):
        ensure_shards(sources["train"], sources["val"], tree)


def test_the_loader_reads_the_same_batches_from_shards_as_from_folders(tree, tmp_path):
    sources = folder_splits(tree)
    pack(sources, tmp_path / "shards", shard_size=SHARD_SIZE)

    def batches(split: Split) -> list[tuple[torch.Tensor, torch.Tensor]]:
        sampler = ShardedSampler(len(split), seed=3, shuffle=True, global_batch=5)
        loader = build_loader(split, Crops(train=True, size=16), sampler, batch=5, workers=2)
        return [(images.clone(), labels.clone()) for images, labels in loader]

    from_folders, from_shards = batches(sources["train"]), batches(open_shards(tmp_path / "shards")[0])
    assert len(from_shards) == 3
    for (images, labels), (shard_images, shard_labels) in zip(from_folders, from_shards, strict=True):
        assert torch.equal(images, shard_images) and torch.equal(labels, shard_labels)


@pytest.fixture(scope="module")
def one_per_class(tmp_path_factory) -> dict[int, ShardSplit]:
    """Shard splits of 24 and 27 samples, each sample a class of its own, so a label names the sample it came from."""
    splits = {}
    for size in (24, 27):
        root = tmp_path_factory.mktemp(f"one-per-class-{size}")
        for number in range(size):
            (root / "train" / f"n{number:03d}").mkdir(parents=True)
            (root / "train" / f"n{number:03d}" / "image.JPEG").write_bytes(image(number))
        (root / "val" / "n000").mkdir(parents=True)
        (root / "val" / "n000" / "image.JPEG").write_bytes(image(0))
        pack(folder_splits(root), root / "shards", shard_size=SHARD_SIZE)
        splits[size] = open_shards(root / "shards")[0]
    return splits


def epoch_reads(split: ShardSplit, world: int, *, seed: int, epoch: int, global_batch: int = 8) -> list[list[int]]:
    """The samples (labels) each rank's loader yields in `epoch`."""
    reads = []
    for rank in range(world):
        sampler = ShardedSampler(
            len(split), seed=seed, shuffle=True, global_batch=global_batch, rank=rank, world_size=world
        )
        loader = build_loader(split, Crops(train=True, size=8), sampler, batch=global_batch // world, workers=0)
        loader.set_epoch(epoch)
        reads.append([int(label) for _, labels in loader for label in labels])
    return reads


@pytest.mark.parametrize("world", [1, 2, 4])
def test_each_epoch_reads_every_sample_once_across_ranks_in_a_fresh_order(one_per_class, world):
    split = one_per_class[24]  # a multiple of the global batch: nothing is dropped
    first = epoch_reads(split, world, seed=1, epoch=0)
    next_epoch = epoch_reads(split, world, seed=1, epoch=1)
    other_seed = epoch_reads(split, world, seed=2, epoch=0)
    for reads in (first, next_epoch, other_seed):
        assert sorted(label for rank in reads for label in rank) == list(range(24))
    assert next_epoch != first and other_seed != first


@pytest.mark.parametrize("world", [1, 2, 4])
def test_an_epoch_drops_only_the_remainder_and_another_one_each_epoch(one_per_class, world):
    split = one_per_class[27]  # 27 = 3 global batches of 8, and 3 left over
    dropped = []
    for epoch in range(3):
        read = [label for rank in epoch_reads(split, world, seed=1, epoch=epoch) for label in rank]
        assert len(read) == len(set(read)) == 24
        dropped.append(frozenset(range(27)) - set(read))
    assert len(set(dropped)) == 3


def test_train_py_packs_the_embedded_set_and_trains_from_its_shards(tmp_path):
    """data.format=shards on the synthetic set: packed beside its folder on first use, then read for training."""
    tiny = ("data.synthetic.classes=2", "data.synthetic.train_per_class=8", "data.synthetic.val_per_class=4")
    run = (
        "experiment=smoke",
        "run.max_epochs=1",
        *ALL_EPOCHS,
        "optim.warmup_epochs=0",
        "data.global_batch=8",
        "data.image_size=32",
    )
    result = run_train(*run, *tiny, "data.format=shards", f"hydra.run.dir={tmp_path / 'run'}", cache=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "epoch   1/1" in result.stdout
    (shards,) = tmp_path.glob("synthetic-*.shards")
    train, val = open_shards(shards)
    assert (len(train), len(val)) == (16, 8)
