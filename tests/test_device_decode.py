"""Decoding on the training device (data.decode=gpu, hybrid, auto), run on the CPU device as the GPU's stand-in:
against the fused decoder (the same boxes, close pixels), the producer thread and its buffers, the split of each
batch between the workers and the device, and auto's choice."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from backends.build import facts_on
from configs.schema import batch_shape
from data import jpeg
from data.build import decode_where_fastest, make_loader, open_splits
from data.loading import decode_choice, device_decode, loader
from data.loading.crop_boxes import Box, centre_crop_box, random_resized_crop_box
from data.loading.device_decode import decode_crops, resize_crops
from data.loading.feeder import BUFFERS, Feeder
from data.sources.split import DatasetError
from distributed import Topology
from tests import jpeg_samples, test_data
from tests.conftest import composed
from tests.test_data import loader_for

COLOUR = ("baseline-420", "baseline-444", "progressive-422")
SHAPES = (jpeg_samples.SMALL, jpeg_samples.BIG, (375, 500), (500, 333))
SIZE = 64


def source_crop(shape: tuple[int, int], box: Box, flip: bool) -> np.ndarray:
    """The box of the picture the file was encoded from, resized as PIL does (antialiased bilinear): what a decoder
    without JPEG's loss would give."""
    top, left, height, width = box
    image = Image.fromarray(jpeg_samples.picture_u8(*shape)).crop((left, top, left + width, top + height))
    pixels = np.asarray(image.resize((SIZE, SIZE), Image.BILINEAR)).astype(np.int16)
    return pixels[:, ::-1] if flip else pixels


@pytest.mark.parametrize("train", [True, False], ids=["random-resized crops", "centre crops"])
def test_the_device_decoder_gives_the_fused_decoders_crops(train: bool) -> None:
    files = [(encoding, shape) for encoding in (*COLOUR, "gray") for shape in SHAPES]
    encoded, boxes, flips = [], [], []
    for seed, (encoding, (height, width)) in enumerate(files):
        data = jpeg_samples.jpeg(encoding, height, width)
        encoded.append(torch.frombuffer(bytearray(data), dtype=torch.uint8))
        if train:
            box, flip = random_resized_crop_box(height, width, area_min=0.08, seed=seed)
        else:
            box, flip = centre_crop_box(height, width, resize=73, size=SIZE), False
        boxes.append(box)
        flips.append(flip)
    assert any(flips) == train
    ours = decode_crops(encoded, boxes, flips, SIZE, torch.device("cpu"))
    assert ours.shape == (len(files), SIZE, SIZE, 3) and ours.dtype == torch.uint8
    for slot, ((encoding, shape), box, flip) in enumerate(zip(files, boxes, flips, strict=True)):
        pixels = ours[slot].numpy().astype(np.int16)
        fused = jpeg.decode_crop(encoded[slot].numpy().tobytes(), box, (SIZE, SIZE), flip).astype(np.int16)
        assert np.abs(pixels - fused).mean() < 6, (encoding, shape, box, flip)  # the fused decoder's own loss: 5.7
        if encoding in COLOUR:  # within JPEG's loss of the source (0.1 to 0.7 here); a box off by two pixels, or a
            # flip the wrong way, gives 3 to 47
            assert np.abs(pixels - source_crop(shape, box, flip)).mean() < 1.5, (encoding, shape, box, flip)


def reference_resize(image: torch.Tensor, box: Box, flip: bool, size: int) -> torch.Tensor:
    """One crop through torch's antialiased bilinear interpolate: what `resize_crops` does to a whole batch."""
    top, left, height, width = box
    crop = image[None, :, top : top + height, left : left + width].float()
    resized = F.interpolate(crop, size=(size, size), mode="bilinear", align_corners=False, antialias=True)
    resized = resized.flip(-1) if flip else resized
    return resized[0].round().clamp(0, 255).to(torch.uint8).permute(1, 2, 0)


@pytest.mark.parametrize("size", [SIZE, 224], ids=["downscaled", "upscaled"])
def test_a_batch_of_crops_is_resized_as_torch_resizes_each(size: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Crops of every shape, flipped and not, in chunks of padded crops: within a rounding of torch's own resize
    (a box a pixel off or a flip the wrong way changes most pixels by many levels)."""
    monkeypatch.setattr(device_decode, "PADDED_ELEMENTS", 3 * 200 * 200)  # several chunks
    images, boxes, flips = [], [], []
    for seed, (height, width) in enumerate([*SHAPES, (40, 30), (500, 500)]):
        picture = torch.from_numpy(jpeg_samples.picture_u8(height, width)).permute(2, 0, 1).contiguous()
        box, flip = random_resized_crop_box(height, width, area_min=0.08, seed=seed)
        images.append(picture)
        boxes.append(box)
        flips.append(flip)
    assert any(flips) and not all(flips)
    ours = resize_crops(images, boxes, flips, size)
    assert ours.shape == (len(images), size, size, 3) and ours.dtype == torch.uint8
    for slot, (image, box, flip) in enumerate(zip(images, boxes, flips, strict=True)):
        difference = (ours[slot].int() - reference_resize(image, box, flip, size).int()).abs()
        assert difference.max() <= 1 and (difference > 0).float().mean() < 0.01, (box, flip)


# The loader with the device decoding: the workers read bytes and draw the crops, a producer thread decodes.

CPU = torch.device("cpu")
tiny_tree = test_data.tiny_tree  # the fixture: a folder dataset of six training and four validation JPEGs
SHARES = {"gpu": 1.0, "hybrid": 0.5}


def counted_device_decodes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of files in each call of the device's decoder, as the loader makes them."""
    calls: list[int] = []

    def decode_each(files: list[torch.Tensor], device: torch.device) -> list[torch.Tensor | None]:
        calls.append(len(files))
        return device_decode.decode_each(files, device)

    monkeypatch.setattr(loader, "decode_each", decode_each)
    return calls


@pytest.mark.parametrize("workers", [0, 1])
@pytest.mark.parametrize("decode", SHARES)
def test_a_loader_decoding_on_the_device_gives_the_workers_batches(
    tiny_tree: Path, workers: int, decode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same samples and crops whoever decodes; a slot the worker decodes is the workers' pixels exactly, one
    the device decodes within its rounding; each batch is one call of the device's decoder, made ahead by the
    producer thread into the loader's fixed buffers."""
    calls = counted_device_decodes(monkeypatch)
    share = SHARES[decode]
    with (
        loader_for(tiny_tree, workers=workers, batch=2) as on_host,
        loader_for(tiny_tree, workers=workers, batch=2, device=CPU, device_share=share) as on_device,
    ):
        for (images, labels), (ours, our_labels) in zip(on_host, on_device, strict=True):
            assert torch.equal(our_labels, labels) and ours.shape == images.shape and ours.device == CPU
            assert any(ours.data_ptr() == buffer.images.data_ptr() for buffer in on_device.feeder.buffers)
            by_device = round(share * len(labels))
            assert (ours[:by_device].int() - images[:by_device].int()).abs().float().mean() < 2
            assert torch.equal(ours[by_device:], images[by_device:])
    assert calls == [round(share * 2)] * 3 and on_device.waited_s > 0


def test_files_the_devices_decoder_does_not_take_are_decoded_by_the_workers(
    tiny_tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A progressive JPEG, a CMYK one and a PNG named .JPEG never reach the device: the workers decode them, to
    the same pixels as when they decode everything."""
    for name, data in (
        ("n01_0", jpeg_samples.jpeg("progressive-420", 130, 160)),
        ("n01_1", jpeg_samples.jpeg("cmyk", 130, 160)),
        ("n01_2", jpeg_samples.png(130, 160)),
    ):
        (tiny_tree / "train" / "n01" / f"{name}.JPEG").write_bytes(data)
    calls = counted_device_decodes(monkeypatch)
    with (
        loader_for(tiny_tree, batch=6) as on_host,
        loader_for(tiny_tree, batch=6, device=CPU, device_share=1.0) as on_device,
    ):
        ((images, labels),), ((ours, our_labels),) = list(on_host), list(on_device)
    assert calls == [3] and torch.equal(our_labels, labels)
    by_worker = [slot for slot, label in enumerate(labels.tolist()) if label == 0]  # the three n01 files
    assert torch.equal(ours[by_worker], images[by_worker])


def test_a_file_the_device_refuses_is_decoded_on_the_host_and_one_without_a_header_replaced(
    tiny_tree: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A JPEG the device's decoder refuses (here a stand-in refuses one file, as nvJPEG may refuse a layout its
    hardware does not take) is decoded by the fused decoder in the training process, the rest of its batch still
    on the device; a file whose header does not read is replaced by the worker, counted and reported once, as
    when the workers decode."""
    refused = (tiny_tree / "train" / "n01" / "n01_1.JPEG").read_bytes()
    decode_all = device_decode.decode_all

    def refusing(files: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
        if any(bytes(file.numpy()) == refused for file in files):
            raise RuntimeError("nvJPEG: unsupported")
        return decode_all(files, device)

    monkeypatch.setattr(device_decode, "decode_all", refusing)
    bad = tiny_tree / "train" / "n02" / "n02_0.JPEG"
    bad.write_bytes(b"\xff\xd8\xff garbage")
    with (
        loader_for(tiny_tree, batch=2) as on_host,
        loader_for(tiny_tree, batch=2, device=CPU, device_share=1.0) as on_device,
    ):
        for _ in range(2):  # two epochs: the bad file is met twice, reported once
            expected = [(images.clone(), labels) for images, labels in on_host]
            batches = [(images.clone(), labels.clone()) for images, labels in on_device]
    assert [labels.tolist() for _, labels in batches] == [labels.tolist() for _, labels in expected]
    for (images, _), (ours, _) in zip(expected, batches, strict=True):
        assert (ours.int() - images.int()).abs().float().mean() < 2
    assert on_device.skipped.keys() == on_host.skipped.keys() == {str(bad)}
    assert caplog.text.count(f"skipped an unreadable file: {on_device.skipped[str(bad)]}") == 2  # once a loader


def test_a_file_without_a_header_ends_the_run_by_policy(tiny_tree: Path) -> None:
    bad = tiny_tree / "val" / "n01" / "n01_0.JPEG"
    bad.write_bytes(b"")
    for workers in (0, 1):
        made = loader_for(tiny_tree, split="val", workers=workers, corrupt="fail", device=CPU, device_share=1.0)
        with made, pytest.raises(DatasetError, match=r"n01_0\.JPEG"):
            list(made)


def test_a_resumed_epoch_gets_the_batches_the_whole_epoch_gave(tiny_tree: Path) -> None:
    """Stop and resume stay bitwise: the sampler and the crops are the same whichever path decodes."""
    with loader_for(tiny_tree, batch=2, device=CPU, device_share=0.5) as whole:
        whole.set_epoch(3)
        expected = [(images.clone(), labels.clone()) for images, labels in whole]
        whole.set_epoch(3, first_batch=1)
        resumed = list(whole)
    assert len(resumed) == 2
    for (images, labels), (again, again_labels) in zip(expected[1:], resumed, strict=True):
        assert torch.equal(images, again) and torch.equal(labels, again_labels)


def test_a_loader_closed_mid_epoch_stops_its_producer_thread_and_its_workers(tiny_tree: Path) -> None:
    """As when a stop signal ends a run between two steps: train.py closes the loaders as the run ends."""
    made = loader_for(tiny_tree, batch=2, workers=1, device=CPU, device_share=1.0)
    with made:
        batches = iter(made)
        next(batches)
    assert not any(thread.name == "feeder" for thread in threading.enumerate())
    assert made._loader._iterator is None


# The producer thread itself, with a stand-in for the decode whose batches say which item they were made from.


def feeder_of(made: list[int], seconds: float = 0.0) -> Feeder[int]:
    def prepare(item: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(seconds)
        made.append(item)
        if item < 0:
            raise DatasetError(f"item {item}")
        return torch.full((2, 4, 4, 3), item, dtype=torch.uint8), torch.full((2,), item)

    return Feeder(prepare, batch=2, size=4, device=CPU)


def test_the_producer_makes_the_next_batches_while_one_is_read_and_never_overwrites_it() -> None:
    made: list[int] = []
    feeder = feeder_of(made)
    for images, labels in feeder(iter(range(8))):
        item = int(labels[0])
        ahead = min(item + 1 + BUFFERS, 8)  # the other buffers filled, and one more batch made, waiting for one
        deadline = time.perf_counter() + 2
        while len(made) < ahead and time.perf_counter() < deadline:
            time.sleep(0.001)  # the thread goes on while this batch is held...
        time.sleep(0.02)
        assert len(made) == ahead  # ...as far as the buffers let it
        assert bool((images == item).all())  # and this one is still as it was made
    assert made == list(range(8))


def test_an_error_in_the_producer_is_raised_to_the_reader_and_a_reader_that_stops_stops_the_thread() -> None:
    with pytest.raises(DatasetError, match="item -1"):
        list(feeder_of([])(iter([0, 1, -1, 2])))
    made: list[int] = []
    batches = feeder_of(made, seconds=0.01)(iter(range(100)))
    next(batches)
    batches.close()
    assert len(made) < 100 and not any(thread.name == "feeder" for thread in threading.enumerate())


def test_crops_drawn_by_two_threads_at_once_are_each_seeds_own() -> None:
    """The producer thread draws crops while the training thread may draw too (a loader of no workers)."""
    expected = [random_resized_crop_box(375, 500, 0.08, seed) for seed in range(2000)]
    drawn: dict[int, list[tuple[Box, bool]]] = {}

    def draw(thread: int) -> None:
        drawn[thread] = [random_resized_crop_box(375, 500, 0.08, seed) for seed in range(2000)]

    threads = [threading.Thread(target=draw, args=(thread,)) for thread in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert drawn == {0: expected, 1: expected}


# data.decode: pinned or chosen by auto.


@pytest.mark.parametrize(("decode", "share"), [("gpu", 1.0), ("hybrid", 0.3), ("cpu", None), ("auto", None)])
def test_data_decode_picks_who_decodes(tiny_tree: Path, decode: str, share: float | None) -> None:
    """auto on the CPU device leaves the decoding to the workers without timing anything: the training process
    would decode at the cost of its own step."""
    overrides = ("data=imagenet", f"data.root={tiny_tree}", "data.global_batch=2", "data.device_share=0.3")
    cfg = composed(*overrides, f"data.decode={decode}")
    train, _ = open_splits(cfg.data, Topology())
    facts = facts_on(cfg, Topology(), CPU, batch_shape(cfg, 1))
    made = make_loader(cfg.data, train, facts, seed=cfg.run.seed, train=True)
    assert made.dataset.device_share == share and made.device == CPU
    assert decode_where_fastest(cfg.data, (made,), facts) is None and made.dataset.device_share == share


@pytest.mark.parametrize(
    ("device_img_s", "share", "says"),
    [
        (50_000.0, 1.0, "the device decodes (data.decode=gpu)"),
        (100.0, None, "the workers decode (data.decode=cpu)"),
        (3000.0, 0.6, "the device decodes 60% of each batch, the workers the rest (data.decode=hybrid "
         "data.device_share=0.6)"),
    ],
)  # fmt: skip
def test_auto_gives_the_device_the_share_that_keeps_both_decoders_busy(
    device_img_s: float, share: float | None, says: str
) -> None:
    choice = decode_choice.choose(decode_choice.Rates(cpu_img_s=400.0, workers=5, device_img_s=device_img_s))
    assert choice.share == share
    assert choice.line.startswith("data.decode=auto: the fused decoder 400 img/s a core x 5 workers = 2,000 img/s")
    assert choice.line.endswith(says)


def test_auto_times_both_decoders_on_the_training_files_and_sets_the_loaders(tiny_tree: Path) -> None:
    with loader_for(tiny_tree, batch=2, workers=1, device=CPU) as made:
        rates = decode_choice.measure(made.dataset, batch=2, workers=3, device=CPU, seconds=0.05)
        assert rates.cpu_img_s > 0 and rates.device_img_s > 0 and rates.workers_img_s == 3 * rates.cpu_img_s
        made.decode_on_device(0.5)
        assert made.dataset.device_share == 0.5 and len(list(made)) == 3
        with pytest.raises(RuntimeError, match="before the loader's first batch"):  # its workers have the dataset
            made.decode_on_device(None)
