"""Training files that go bad while a loader runs: removed, truncated or replaced after the index was built, a tar
shard cut short, overwritten or removed. Each gives one line naming it and why, then data.corrupt's behaviour (the
sample replaced and counted, or the run stopped), up to data.max_skipped; a replacement changes only its own slot,
and a loader restarted mid-epoch (a resumed run) draws the same replacement."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from data.loading.loader import Crops, Loader, build_loader
from data.loading.sampler import ShardedSampler
from data.shards.read import BLOCK, ShardSplit, open_shards
from data.shards.write import pack
from data.sources import folder_index
from data.sources.folder_index import FolderSplit, find_classes, open_split
from data.sources.split import DatasetError, Split, UnreadableSample
from tests.conftest import config_error
from tests.jpeg_samples import jpeg

WNIDS = ("n01", "n02")
PER_CLASS = 12
BATCH = 2  # 24 images: 12 batches an epoch
READ_FIRST = 2  # batches read before a file goes bad; 2 workers have then asked for batches up to the 6th at most
LATE = 16  # the first position of the epoch's order from which files are damaged (the 9th batch on)
SHARD_SIZE = 10_000  # three images a shard
Batches = list[tuple[torch.Tensor, torch.Tensor]]


def image(number: int) -> bytes:
    """A small JPEG, its width and so its bytes different with `number`."""
    return jpeg("baseline-420", 24, 24 + number)


@pytest.fixture
def photos(tmp_path: Path) -> Path:
    """A torchvision-layout tree of 2 classes x 12 small JPEGs (and one validation image a class)."""
    for wnid in WNIDS:
        for number in range(PER_CLASS):
            path = tmp_path / "train" / wnid / f"{wnid}_{number}.JPEG"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(image(number))
        (tmp_path / "val" / wnid).mkdir(parents=True)
        (tmp_path / "val" / wnid / f"{wnid}_val.JPEG").write_bytes(image(0))
    return tmp_path


def train_split(root: Path) -> FolderSplit:
    return open_split(root / "train", find_classes(root / "train"))


def loader_for(split: Split, workers: int, **options: Any) -> Loader:
    sampler = ShardedSampler(len(split), seed=1, shuffle=True, global_batch=BATCH)
    return build_loader(split, Crops(train=True, size=16), sampler, batch=BATCH, workers=workers, **options)


def order(split: Split, epoch: int = 0) -> list[int]:
    """The samples an epoch reads, in order."""
    sampler = ShardedSampler(len(split), seed=1, shuffle=True, global_batch=BATCH)
    sampler.set_epoch(epoch)
    return [index for index, _ in sampler]


def late_files(split: FolderSplit, count: int) -> list[Path]:
    """`count` files of different batches that epoch 0 reads after READ_FIRST batches and what workers fetch ahead."""
    return [Path(split[index][0]) for index in order(split)[LATE : LATE + 2 * count : 2]]


def kept(batches: Iterator[tuple[torch.Tensor, torch.Tensor]]) -> Batches:
    """The batches, copied out of the workers' shared memory."""
    return [(images.clone(), labels.clone()) for images, labels in batches]


def two_epochs_going_bad(
    split: Split, workers: int, damage: Callable[[], object], after: int = READ_FIRST, **options: Any
) -> tuple[Loader, Batches]:
    """Epochs 0 and 1 of a loader, `damage()` done after its first `after` batches: the batches, and the loader."""
    loader = loader_for(split, workers, **options)
    with loader:
        batches = iter(loader)
        read = kept(next(batches) for _ in range(after))
        damage()
        read += kept(batches)
        loader.set_epoch(1)
        read += kept(iter(loader))
    return loader, read


def skip_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.getMessage().startswith("skipped")]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_file_removed_truncated_or_replaced_mid_epoch_is_skipped_with_one_line_naming_it(photos, workers, caplog):
    split = train_split(photos)
    removed, truncated, replaced = late_files(split, 3)
    sizes = {path: path.stat().st_size for path in (truncated, replaced)}
    larger = jpeg("baseline-420", 40, 80)
    assert len(larger) > sizes[replaced]

    def damage() -> None:
        removed.unlink()
        os.truncate(truncated, 100)
        replaced.write_bytes(larger)  # a valid JPEG, of another size than the index holds

    loader, batches = two_epochs_going_bad(split, workers, damage)
    assert len(batches) == 24 and all(len(labels) == BATCH for _, labels in batches)
    why = {
        removed: "removed since the index was built",
        truncated: f"truncated or replaced since the index was built (100 of {sizes[truncated]} bytes)",
        replaced: f"replaced since the index was built ({len(larger)} bytes, indexed {sizes[replaced]})",
    }
    assert loader.skipped == {str(path): f"{path}: {reason}" for path, reason in why.items()}
    assert sorted(skip_lines(caplog)) == sorted(f"skipped an unreadable file: {why}" for why in loader.skipped.values())


@pytest.mark.parametrize("workers", [0, 2])
def test_a_file_that_goes_bad_mid_epoch_stops_the_run_under_corrupt_fail_naming_it(photos, workers):
    split = train_split(photos)
    (truncated,) = late_files(split, 1)
    size = truncated.stat().st_size
    with pytest.raises(DatasetError) as stopped:
        two_epochs_going_bad(split, workers, lambda: os.truncate(truncated, 10), corrupt="fail")
    expected = f"unreadable file {truncated}: truncated or replaced since the index was built (10 of {size} bytes)"
    assert str(stopped.value) == expected


@pytest.mark.parametrize("workers", [0, 2])
def test_more_skipped_files_than_data_max_skipped_stop_the_run_naming_the_key(photos, workers, caplog):
    split = train_split(photos)
    files = late_files(split, 3)

    def remove() -> None:
        for path in files:
            path.unlink()

    with pytest.raises(DatasetError) as stopped:
        two_epochs_going_bad(split, workers, remove, max_skipped=2)
    message = str(stopped.value)
    assert "\n" not in message
    last = re.fullmatch(
        r"3 unreadable files skipped, more than data\.max_skipped=2; the last (.*): removed since the index was "
        r"built\. Repair the dataset, or raise data\.max_skipped",
        message,
    )
    assert last and Path(last[1]) in files
    assert len(skip_lines(caplog)) == 3  # the last one's line too


def test_data_max_skipped_is_checked_in_one_line():
    told = config_error("data.max_skipped=-1")
    assert told == "data.max_skipped: must be 0 or more, got -1"


@pytest.mark.parametrize("workers", [0, 2])
def test_a_bad_file_changes_only_its_own_slot_and_a_restarted_loader_draws_the_same_replacement(photos, workers):
    split = train_split(photos)
    with loader_for(split, 0) as whole:  # the run where every file stays fine
        fine = kept(iter(whole))
        whole.set_epoch(1)
        fine += kept(iter(whole))
    (bad,) = late_files(split, 1)
    bad_index = next(index for index in range(len(split)) if split[index][0] == str(bad))
    _, going_bad = two_epochs_going_bad(split, workers, lambda: os.truncate(bad, 200))

    read = order(split) + order(split, 1)  # both epochs' samples, slot after slot
    assert read.count(bad_index) == 2  # once an epoch
    for number, index in enumerate(read):
        batch, slot = divmod(number, BATCH)
        (images, labels), (fine_images, fine_labels) = going_bad[batch], fine[batch]
        same = torch.equal(images[slot], fine_images[slot]) and labels[slot] == fine_labels[slot]
        assert same == (index != bad_index), f"batch {batch}, slot {slot}"

    restart = LATE // BATCH - 1  # a batch before the bad file's: where a run resumed from a checkpoint starts
    with loader_for(split, workers) as resumed:
        resumed.set_epoch(0, first_batch=restart)
        again = kept(iter(resumed))
        resumed.set_epoch(1)
        again += kept(iter(resumed))
    for ours, theirs in zip(again, going_bad[restart:], strict=True):
        assert torch.equal(ours[0], theirs[0]) and torch.equal(ours[1], theirs[1])
    assert list(resumed.skipped) == [str(bad)]


def test_a_file_unreadable_when_its_bytes_are_cached_is_skipped_when_read(photos):
    split = train_split(photos)
    (removed,) = late_files(split, 1)
    removed.unlink()
    with loader_for(split, 0, cache_bytes=True) as loader:
        assert len(list(loader)) == 12
    assert loader.skipped == {str(removed): f"{removed}: removed since the index was built"}


def test_the_saved_index_keeps_each_files_size_so_a_later_start_sees_it_truncated(photos, tmp_path, monkeypatch):
    week_ago = time.time() - 7 * 86400  # a settled tree, whose index is saved
    for path in (photos / "train", *(photos / "train").iterdir()):
        os.utime(path, (week_ago, week_ago))
    classes = find_classes(photos / "train")
    open_split(photos / "train", classes, cache=tmp_path / "index")
    (truncated,) = late_files(train_split(photos), 1)
    size = truncated.stat().st_size
    os.truncate(truncated, 50)  # in place: its folder's mtime stays, and the saved index is reused
    monkeypatch.setattr(folder_index, "_image_names", lambda directory: pytest.fail(f"listed {directory} again"))
    split = open_split(photos / "train", classes, cache=tmp_path / "index")
    index = next(i for i in range(len(split)) if split[i][0] == str(truncated))
    with pytest.raises(UnreadableSample) as unreadable:
        split.read(index)
    assert str(unreadable.value) == f"{truncated}: truncated or replaced since the index was built (50 of {size} bytes)"


def test_a_file_that_could_not_be_stated_when_indexed_is_missing_when_read(photos):
    broken = photos / "train" / "n01" / "n01_broken.JPEG"
    broken.symlink_to(photos / "nowhere.JPEG")
    split = train_split(photos)
    index = next(i for i in range(len(split)) if split[i][0] == str(broken))
    with pytest.raises(UnreadableSample) as unreadable:
        split.read(index)
    assert str(unreadable.value) == f"{broken}: missing"


@pytest.fixture
def shards(photos: Path) -> ShardSplit:
    """The tree packed into tar shards of three images each, its training split."""
    train, val = (open_split(photos / name, find_classes(photos / "train")) for name in ("train", "val"))
    pack({"train": train, "val": val}, photos / "shards", shard_size=SHARD_SIZE)
    return open_shards(photos / "shards")[0]


def late_shard(split: ShardSplit) -> int:
    """The shard of a sample that epoch 0 reads late, not the last shard."""
    shard = int(split.shard[order(split)[LATE]])
    return shard if shard < len(split.files) - 1 else shard - 1


def members(split: ShardSplit, shard: int) -> list[int]:
    return [index for index in range(len(split)) if split.shard[index] == shard]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_shard_cut_short_mid_epoch_skips_the_members_it_lost_naming_shard_and_member(shards, workers, caplog):
    shard = late_shard(shards)
    lost = members(shards, shard)[1:]
    cut = int(shards.offset[lost[0]])  # the first member's data stays, the rest is gone
    _, batches = two_epochs_going_bad(shards, workers, lambda: os.truncate(shards.files[shard], cut))
    assert len(batches) == 24
    expected = {}
    for index in lost:
        start, size = int(shards.offset[index]) - BLOCK, int(shards.size[index])  # its header and data
        missing = BLOCK + size - max(0, cut - start)
        expected[shards[index][0]] = (
            f"{shards[index][0]}: the shard ends {missing} bytes before this member does: truncated"
        )
    assert len(lost) > 1 and loader_skipped(caplog) == expected


def loader_skipped(caplog: pytest.LogCaptureFixture) -> dict[str, str]:
    """The files skipped, as their lines say: each once."""
    lines = skip_lines(caplog)
    reasons = [line.removeprefix("skipped an unreadable file: ") for line in lines]
    named = {reason.split(": ", 1)[0]: reason for reason in reasons}
    assert len(named) == len(lines)
    return named


@pytest.mark.parametrize("workers", [0, 2])
def test_a_shard_overwritten_mid_epoch_skips_its_members_naming_shard_and_member(shards, workers, caplog):
    shard = late_shard(shards)
    path, other = shards.files[shard], shards.files[shard + 1]

    def overwrite() -> None:  # another shard's bytes, to this one's size (which the start-up check compares)
        size = path.stat().st_size
        data = other.read_bytes()[:size]
        path.write_bytes(data + bytes(size - len(data)))

    # between two epochs, where no worker reads: a reader in the middle of the write would find it truncated
    _, batches = two_epochs_going_bad(shards, workers, overwrite, after=len(shards) // BATCH)
    assert len(batches) == 24
    expected = {
        shards[i][0]: f"{shards[i][0]}: the tar header before it is not its own: the shard was overwritten"
        for i in members(shards, shard)
    }
    assert loader_skipped(caplog) == expected


def test_a_shard_removed_before_a_process_opened_it_skips_its_members_naming_them(shards, caplog):
    shard = late_shard(shards)
    shards.files[shard].unlink()
    with loader_for(shards, 0) as loader:
        assert len(list(loader)) == 12
    assert loader.skipped == {
        shards[i][0]: f"{shards[i][0]}: the shard was removed since the run opened it" for i in members(shards, shard)
    }
