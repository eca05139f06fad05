import io
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from configs.schema import batch_shape
from data.build import loader_workers, too_few_images
from data.loading.crop_boxes import centre_crop_box, random_resized_crop_box
from data.loading.loader import BatchDataset, Crops, Loader, build_loader, workers_for_cores
from data.loading.sampler import ShardedSampler
from data.sources import folder_index
from data.sources.folder_index import find_classes, open_split
from data.sources.split import DatasetError
from distributed import Topology
from monitor.progress import print_summary
from tests import jpeg_samples
from tests.conftest import composed, run_train


def jpeg_bytes(height: int, width: int, seed: int = 0) -> bytes:
    """A smooth gradient with a distinct colour per quadrant, so crops and flips show in the pixels."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    pixels = np.stack([x * 255 // width, y * 255 // height, rng.integers(0, 40, (height, width))], axis=-1)
    buffer = io.BytesIO()
    Image.fromarray(pixels.astype(np.uint8)).save(buffer, format="JPEG", quality=95)
    return buffer.getvalue()


def test_random_resized_crop_box_is_inside_the_image_and_seeded():
    draws = [random_resized_crop_box(375, 500, 0.08, seed) for seed in range(200)]
    for (top, left, h, w), _ in draws:
        assert top >= 0 and top + h <= 375 and left >= 0 and left + w <= 500
        assert 0.08 * 375 * 500 * 0.99 <= h * w <= 375 * 500
    assert len({box for box, _ in draws}) > 190
    assert 60 < sum(flip for _, flip in draws) < 140
    assert random_resized_crop_box(375, 500, 0.08, 7) == draws[7]


def test_crop_box_draw_leaves_the_global_generator_alone():
    torch.manual_seed(3)
    expected = torch.rand(3)
    torch.manual_seed(3)
    random_resized_crop_box(300, 400, 0.08, 1)
    assert torch.equal(torch.rand(3), expected)


def test_centre_crop_box_matches_resize_then_centre_crop():
    # 500x375 resized so the short side is 256 -> 341x256; the 224 centre crop keeps 224/256 of the short side.
    top, left, h, w = centre_crop_box(375, 500, 256, 224)
    assert (h, w) == (328, 328)
    assert abs(top - (375 - 328) / 2) <= 1 and abs(left - (500 - 328) / 2) <= 1


def test_sampler_shards_are_disjoint_full_batches_and_change_per_epoch():
    shards = [ShardedSampler(103, seed=5, shuffle=True, global_batch=8, rank=r, world_size=2) for r in range(2)]
    indices = [[i for i, _ in s] for s in shards]
    assert len(indices[0]) == len(indices[1]) == len(shards[0]) == 48  # 96 = 12 full global batches
    assert not set(indices[0]) & set(indices[1])
    seeds = [seed for s in shards for _, seed in s]
    assert len(set(seeds)) == 96
    again = ShardedSampler(103, seed=5, shuffle=True, global_batch=8, rank=0, world_size=2)
    assert [i for i, _ in again] == indices[0]
    again.set_epoch(1)
    assert [i for i, _ in again] != indices[0]


def test_an_epoch_started_at_a_position_reads_the_rest_of_the_same_samples():
    def sampler() -> ShardedSampler:
        return ShardedSampler(103, seed=5, shuffle=True, global_batch=8, rank=1, world_size=2)

    whole, rest = sampler(), sampler()
    whole.set_epoch(3)
    rest.set_epoch(3, start=20)
    assert list(rest) == list(whole)[20:] and len(rest) == len(whole) - 20 == 28  # the same indices and seeds
    rest.set_epoch(4)
    whole.set_epoch(4)
    assert list(rest) == list(whole)


def test_eval_sampler_reads_every_sample_once_in_order():
    shards = [ShardedSampler(10, seed=0, shuffle=False, rank=r, world_size=3) for r in range(3)]
    assert sorted(i for s in shards for i, _ in s) == list(range(10))
    assert [i for i, _ in shards[0]] == [0, 3, 6, 9]


@pytest.fixture
def tiny_tree(tmp_path):
    for split, count in (("train", 3), ("val", 2)):
        for wnid in ("n01", "n02"):
            folder = tmp_path / split / wnid
            folder.mkdir(parents=True)
            for i in range(count):
                (folder / f"{wnid}_{i}.JPEG").write_bytes(jpeg_bytes(120 + 10 * i, 160, seed=i))
    return tmp_path


def loader_for(root, *, split="train", workers=0, batch=4, **options) -> Loader:
    samples = open_split(root / split, find_classes(root / "train"))
    train = split == "train"
    sampler = ShardedSampler(len(samples), seed=1, shuffle=train, global_batch=batch)
    crops = Crops(train=train, size=32, area_min=0.08, eval_resize=37)
    return build_loader(samples, crops, sampler, batch=batch, workers=workers, **options)


def test_folder_index_and_loader_give_uint8_nhwc_batches(tiny_tree):
    classes = find_classes(tiny_tree / "train")
    train = open_split(tiny_tree / "train", classes)
    assert classes == ("n01", "n02") and len(train) == 6
    assert [train[i] for i in (0, 3, -1)] == [
        (f"{tiny_tree}/train/n01/n01_0.JPEG", 0),
        (f"{tiny_tree}/train/n02/n02_0.JPEG", 1),
        (f"{tiny_tree}/train/n02/n02_2.JPEG", 1),
    ]
    assert [label for _, label in train] == [0, 0, 0, 1, 1, 1]
    batches = list(loader_for(tiny_tree))
    assert len(batches) == 1
    images, labels = batches[0]
    assert images.shape == (4, 32, 32, 3) and images.dtype == torch.uint8 and labels.dtype == torch.int64


def test_evaluation_reads_every_sample_with_a_partial_last_batch(tiny_tree):
    """Both batch sizes are known before the epoch (device.compile compiles each ahead); training has one."""
    loader = loader_for(tiny_tree, split="val", batch=3)
    batches = list(loader)
    assert [len(labels) for _, labels in batches] == [3, 1]
    assert loader.batch_sizes() == [3, 1]
    assert loader_for(tiny_tree, batch=4).batch_sizes() == [4]  # six images, full batches only


@pytest.mark.parametrize(
    ("local_ranks", "usable", "machine", "workers"),
    [
        (1, 16, 16, 15),  # one GPU on a 16-core machine: every core but the training process's
        (8, 16, 16, 1),  # eight torchrun ranks share the 16 cores
        (2, 8, 16, 7),  # srun bound 8 cores to each of two tasks
        (1, 4, 64, 3),  # taskset left 4 of 64 cores
        (1, 1, 1, 0),  # one core: the training process loads
    ],
)
def test_workers_null_gives_each_rank_its_share_of_the_cores_but_one(local_ranks, usable, machine, workers):
    assert workers_for_cores(local_ranks, usable, machine) == workers


def test_the_same_seed_gives_the_same_batches_in_workers_and_from_cached_bytes(tiny_tree):
    reference = [images for images, _ in loader_for(tiny_tree, batch=2)]
    assert len(reference) == 3 and not torch.equal(reference[0], reference[1])
    for options in ({"workers": 2}, {"cache_bytes": True}):
        again = [images for images, _ in loader_for(tiny_tree, batch=2, **options)]
        assert all(torch.equal(a, b) for a, b in zip(reference, again, strict=True)), options


def test_worker_batches_arrive_in_shared_memory(tiny_tree):
    images, _ = next(iter(loader_for(tiny_tree, workers=1)))
    assert images.is_shared()


def test_folder_index_refuses_a_val_class_that_train_lacks(tiny_tree):
    (tiny_tree / "val" / "n99").mkdir()
    with pytest.raises(DatasetError, match="n99"):
        open_split(tiny_tree / "val", find_classes(tiny_tree / "train"))


NO_IMAGES = "holds no images (.jpeg, .jpg, .png): add the class's images, or remove the folder"


def empty_class_folder(root: Path, split: str) -> Path:
    """Empty n02's folder of `split` in the tiny tree (its training folder keeps a note that is not an image)."""
    folder = root / split / "n02"
    for image in folder.iterdir():
        image.unlink()
    (folder / "README.txt").write_text("not an image")
    return folder


@pytest.mark.parametrize("split", ["train", "val"])
def test_an_empty_class_folder_is_refused_by_name_also_from_the_saved_index(tiny_tree, tmp_path, split, monkeypatch):
    empty = empty_class_folder(tiny_tree, split)
    week_ago = time.time() - 7 * 86400  # a settled tree, whose index is saved
    for path in (tiny_tree / split, *(tiny_tree / split).iterdir()):
        os.utime(path, (week_ago, week_ago))
    for scanned in (True, False):
        if not scanned:  # the second start reads the index the first one saved
            monkeypatch.setattr(
                folder_index, "_image_names", lambda directory: pytest.fail(f"listed {directory} again")
            )
        with pytest.raises(DatasetError) as refused:
            open_split(tiny_tree / split, ("n01", "n02"), cache=tmp_path / "index")
        assert str(refused.value) == f"{empty} {NO_IMAGES}"


def test_train_py_refuses_an_empty_class_folder_in_one_line_with_exit_status_2(tiny_tree, tmp_path):
    empty = empty_class_folder(tiny_tree, "val")
    result = run_train(
        "data.name=imagenet", f"data.root={tiny_tree}", f"hydra.run.dir={tmp_path / 'run'}", cache=tmp_path
    )
    assert result.returncode == 2, result.stderr
    (message,) = result.stderr.splitlines()  # one line: no traceback, no line of Hydra's
    assert message == f"error: {empty} {NO_IMAGES}"


def test_unreadable_file_is_replaced_counted_and_reported_once(tiny_tree, caplog):
    bad = tiny_tree / "train" / "n01" / "n01_0.JPEG"
    bad.write_bytes(b"\xff\xd8\xff garbage")
    loader = loader_for(tiny_tree, batch=2)
    for _ in range(2):  # two epochs: the file is met twice, reported once
        batches = list(loader)
    assert len(batches) == 3 and all(len(labels) == 2 for _, labels in batches)
    assert list(loader.skipped) == [str(bad)]
    assert [r.getMessage() for r in caplog.records].count(
        f"skipped an unreadable file: {loader.skipped[str(bad)]}"
    ) == 1
    assert str(bad) in caplog.text


def test_unreadable_file_is_fatal_by_policy_naming_the_file(tiny_tree):
    bad = tiny_tree / "val" / "n01" / "n01_0.JPEG"
    bad.write_bytes(b"")
    for workers in (0, 1):
        with pytest.raises(DatasetError, match=r"n01_0\.JPEG"):
            list(loader_for(tiny_tree, split="val", workers=workers, corrupt="fail"))


def test_loader_workers_leave_stop_signals_to_the_training_process(tiny_tree):
    """SLURM and a terminal signal every process of the run: a worker that died of it would end the run before
    the training process could checkpoint."""
    children = Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children")
    others = set(children.read_text().split())  # earlier tests' workers may still be winding down
    loader = loader_for(tiny_tree, batch=2, workers=2)
    reference = [images for images, _ in loader]
    batches = iter(loader)
    first, _ = next(batches)
    workers = set(children.read_text().split()) - others
    assert len(workers) == 2
    for pid in workers:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            os.kill(int(pid), signum)
    time.sleep(0.5)
    rest = [images for images, _ in batches]
    assert all(torch.equal(a, b) for a, b in zip(reference, [first, *rest], strict=True))


def test_a_dead_worker_is_an_error_not_a_hang(tiny_tree, monkeypatch):
    def die(*args):
        os._exit(3)

    monkeypatch.setattr(BatchDataset, "decode_crop_into", die)
    with pytest.raises(RuntimeError, match="worker"):
        list(loader_for(tiny_tree, workers=1))


def test_class_folders_are_listed_by_threads_only_on_a_network_filesystem(monkeypatch, tmp_path):
    assert folder_index.filesystem_type(Path("/proc/self")) == "proc"  # the longest mount point above the path
    for kind, threads in [("ext4", 1), ("nfs4", folder_index.SCAN_THREADS), ("fuse.sshfs", folder_index.SCAN_THREADS)]:
        monkeypatch.setattr(folder_index, "filesystem_type", lambda path, kind=kind: kind)
        assert folder_index.scan_threads(tmp_path) == threads, kind


def test_files_decoded_despite_libjpeg_warnings_are_counted_for_the_summary(tiny_tree, capsys):
    damaged = tiny_tree / "train" / "n01" / "n01_1.JPEG"
    damaged.write_bytes(jpeg_samples.with_bad_huffman_code(jpeg_samples.jpeg("baseline-420", *jpeg_samples.SMALL)))
    samples = open_split(tiny_tree / "train", find_classes(tiny_tree / "train"))
    sampler = ShardedSampler(len(samples), seed=1, shuffle=True, global_batch=2)
    whole = Crops(train=True, size=32, area_min=1.0)  # whole images: the damaged rows at the bottom are decoded
    with build_loader(samples, whole, sampler, batch=2, workers=1) as loader:
        assert len(list(loader)) == 3
    assert loader.skipped == {} and loader.warned == {str(damaged)}
    print_summary("success", 0.8, 1, 0.1, tiny_tree, loader.skipped, loader.warned)
    summary = capsys.readouterr().out
    assert "\n1 files decoded despite libjpeg's corrupt-data warnings (as PIL decodes them)\n" in summary


def test_the_imagenet_recipe_gives_each_rank_its_share_of_the_cores(tmp_path, monkeypatch):
    """experiment=imagenet leaves data.workers null: on a 16-core machine, two torchrun ranks get 7 workers each."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    cfg = composed("experiment=imagenet", f"data.root={tmp_path}")
    assert cfg.data.workers is None
    assert loader_workers(cfg.data, Topology(rank=1, world_size=2, local_rank=1, local_world_size=2)) == 7
    assert loader_workers(composed("data.workers=3").data, Topology()) == 3


@pytest.mark.parametrize("experiment", sorted(path.stem for path in Path("configs/experiment").glob("*.yaml")))
def test_no_recipe_gives_a_two_core_machine_more_loader_processes_than_cores(experiment, tmp_path, monkeypatch):
    """Only a user's data.workers=N may ask for more workers than cores (PyTorch then warns, as it did for the
    8 of experiment=imagenet on 2 cores)."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    cfg = composed(f"experiment={experiment}", f"data.root={tmp_path}")
    assert loader_workers(cfg.data, Topology()) <= 1  # and the training process on the other core


def test_a_training_set_smaller_than_a_batch_is_refused_with_the_batch_that_fits(tiny_tree):
    """experiment=imagenet's batch of 3264 on six images: no epoch would have a step (it used to end in a traceback
    from torch.stack of no losses). The line names the override that fits, a power of two that the ranks divide
    (train.py's line, its exit status and the folder it leaves: tests/test_user_files.py)."""
    cfg = composed("experiment=imagenet", f"data.root={tiny_tree}")
    assert too_few_images(6, batch_shape(cfg, world_size=1)) == (
        "3264 is more than the 6 training images: an epoch would have no step; give data.global_batch=4 (or fewer)"
    )
    four_ranks = too_few_images(6, batch_shape(cfg, world_size=4))
    assert four_ranks.endswith("give data.global_batch=4 (or fewer)")  # divisible by the 4 ranks
    assert too_few_images(3, batch_shape(cfg, world_size=4)).endswith("the set needs at least 4 images")
