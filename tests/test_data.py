import io

import numpy as np
import pytest
import torch
from PIL import Image

from data.decode import DecodeError, decode_crop, image_size
from data.folder import DatasetError, find_classes, index_split
from data.loader import CropDataset, build_loader
from data.sampler import ShardedSampler
from data.transforms import centre_crop_box, random_resized_crop_box


def jpeg_bytes(height: int, width: int, seed: int = 0) -> bytes:
    """A smooth gradient with a distinct colour per quadrant, so crops and flips show in the pixels."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    pixels = np.stack([x * 255 // width, y * 255 // height, rng.integers(0, 40, (height, width))], axis=-1)
    buffer = io.BytesIO()
    Image.fromarray(pixels.astype(np.uint8)).save(buffer, format="JPEG", quality=95)
    return buffer.getvalue()


def test_random_resized_crop_box_is_inside_the_image_and_seeded():
    boxes = []
    for seed in range(200):
        top, left, h, w = random_resized_crop_box(375, 500, 0.08, torch.Generator().manual_seed(seed))
        assert top >= 0 and top + h <= 375 and left >= 0 and left + w <= 500
        assert 0.08 * 375 * 500 * 0.99 <= h * w <= 375 * 500
        boxes.append((top, left, h, w))
    assert len(set(boxes)) > 190
    again = random_resized_crop_box(375, 500, 0.08, torch.Generator().manual_seed(7))
    assert again == boxes[7]


def test_crop_box_draw_leaves_the_global_generator_alone():
    torch.manual_seed(3)
    expected = torch.rand(3)
    torch.manual_seed(3)
    random_resized_crop_box(300, 400, 0.08, torch.Generator().manual_seed(1))
    assert torch.equal(torch.rand(3), expected)


def test_centre_crop_box_matches_resize_then_centre_crop():
    # 500x375 resized so the short side is 256 -> 341x256; the 224 centre crop keeps 224/256 of the short side.
    top, left, h, w = centre_crop_box(375, 500, 256, 224)
    assert (h, w) == (328, 328)
    assert abs(top - (375 - 328) / 2) <= 1 and abs(left - (500 - 328) / 2) <= 1


def test_decode_crop_shape_flip_and_scaled_decode():
    data = jpeg_bytes(400, 600)
    assert image_size(data) == (400, 600)
    whole = decode_crop(data, None, (40, 60))
    assert whole.shape == (40, 60, 3) and whole.dtype == np.uint8
    flipped = decode_crop(data, None, (40, 60), flip=True)
    np.testing.assert_array_equal(flipped, whole[:, ::-1])
    # The right half of the image: red (x gradient) is high there. DCT-scaled decoding (crop 300 px -> 32 px)
    # must agree with a full decode, resized, to within JPEG's and the scaling's error.
    right = decode_crop(data, (0, 300, 400, 300), (32, 32))
    reference = np.asarray(Image.open(io.BytesIO(data)).convert("RGB").crop((300, 0, 600, 400)).resize((32, 32)))
    assert right[..., 0].min() > 120
    assert np.abs(right.astype(int) - reference.astype(int)).mean() < 4


@pytest.mark.parametrize("data", [b"", b"not an image at all", jpeg_bytes(64, 64)[:200]])
def test_undecodable_bytes_raise_decode_error(data: bytes):
    with pytest.raises(DecodeError):
        decode_crop(data, None, (16, 16))


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


def test_folder_index_and_loader_give_uint8_nhwc_batches(tiny_tree):
    classes = find_classes(tiny_tree)
    train = index_split(tiny_tree, "train", classes)
    assert classes == ("n01", "n02") and len(train) == 6 and train.labels == (0, 0, 0, 1, 1, 1)
    dataset = CropDataset(train, train=True, size=32, area_min=0.08, eval_resize=37)
    loader = build_loader(dataset, ShardedSampler(6, seed=1, shuffle=True, global_batch=4), batch=4, workers=0)
    batches = list(loader)
    assert len(batches) == 1
    images, labels = batches[0]
    assert images.shape == (4, 32, 32, 3) and images.dtype == torch.uint8 and labels.dtype == torch.int64
    again = next(iter(loader))
    assert torch.equal(again[0], images)  # the same epoch draws the same crops


def test_folder_index_refuses_a_val_class_that_train_lacks(tiny_tree):
    (tiny_tree / "val" / "n99").mkdir()
    with pytest.raises(DatasetError, match="n99"):
        index_split(tiny_tree, "val", find_classes(tiny_tree))


def test_corrupt_file_is_reported_with_its_path(tiny_tree):
    bad = tiny_tree / "val" / "n01" / "n01_0.JPEG"
    bad.write_bytes(b"\xff\xd8\xff garbage")
    val = index_split(tiny_tree, "val", find_classes(tiny_tree))
    dataset = CropDataset(val, train=False, size=32, area_min=0.08, eval_resize=37)
    with pytest.raises(DatasetError, match=r"n01_0\.JPEG"):
        dataset[(0, 0)]
