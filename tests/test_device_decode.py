"""data.decode=gpu's decoder, run on the CPU device against the fused decoder: the same boxes, close pixels."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from backends.build import facts_on
from data import jpeg, loader
from data.build import make_loader, open_splits
from data.device_decode import decode_crops
from data.split import DatasetError
from data.transforms import Box, centre_crop_box, random_resized_crop_box
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


# The loader with data.decode=gpu: the workers read bytes and draw the crops, the training device decodes.

CPU = torch.device("cpu")
tiny_tree = test_data.tiny_tree  # the fixture: a folder dataset of six training and four validation JPEGs


@pytest.mark.parametrize("workers", [0, 1])
def test_a_loader_decoding_on_the_device_gives_the_workers_batches(
    tiny_tree: Path, workers: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []
    monkeypatch.setattr(loader, "decode_crops", lambda *args: calls.append(len(args[0])) or decode_crops(*args))
    with (
        loader_for(tiny_tree, workers=workers, batch=2) as on_host,
        loader_for(tiny_tree, workers=workers, batch=2, device=CPU, decode_on_device=True) as on_device,
    ):
        for (images, labels), (ours, our_labels) in zip(on_host, on_device, strict=True):
            assert torch.equal(our_labels, labels) and ours.shape == images.shape and ours.device == CPU
            assert (ours.int() - images.int()).abs().float().mean() < 2  # the same crops, decoded alike
    assert on_device.waited_s > 0 and calls == [2, 2, 2]  # each batch decoded by the device, as a whole


def test_a_file_the_device_cannot_decode_is_decoded_on_the_host_and_one_without_a_header_replaced(
    tiny_tree: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A PNG named .JPEG goes to the fused decoder in the training process; a file whose header does not read is
    replaced by the worker, counted and reported once, as when the workers decode."""
    png = tiny_tree / "train" / "n01" / "n01_1.JPEG"
    png.write_bytes(jpeg_samples.png(130, 160))
    bad = tiny_tree / "train" / "n02" / "n02_0.JPEG"
    bad.write_bytes(b"\xff\xd8\xff garbage")
    with (
        loader_for(tiny_tree, batch=2) as on_host,
        loader_for(tiny_tree, batch=2, device=CPU, decode_on_device=True) as on_device,
    ):
        for _ in range(2):  # two epochs: the bad file is met twice, reported once
            expected, batches = list(on_host), list(on_device)
    assert [labels.tolist() for _, labels in batches] == [labels.tolist() for _, labels in expected]
    for (images, _), (ours, _) in zip(expected, batches, strict=True):
        assert (ours.int() - images.int()).abs().float().mean() < 2
    assert on_device.skipped.keys() == on_host.skipped.keys() == {str(bad)}
    assert caplog.text.count(f"skipped an unreadable file: {on_device.skipped[str(bad)]}") == 2  # once a loader


def test_a_file_without_a_header_ends_the_run_by_policy(tiny_tree: Path) -> None:
    bad = tiny_tree / "val" / "n01" / "n01_0.JPEG"
    bad.write_bytes(b"")
    for workers in (0, 1):
        with pytest.raises(DatasetError, match=r"n01_0\.JPEG"):
            list(loader_for(tiny_tree, split="val", workers=workers, corrupt="fail", device=CPU, decode_on_device=True))


@pytest.mark.parametrize(("decode", "on_device"), [("gpu", True), ("cpu", False)])
def test_data_decode_picks_who_decodes(tiny_tree: Path, decode: str, on_device: bool) -> None:
    cfg = composed("data=imagenet", f"data.root={tiny_tree}", "data.global_batch=2", f"data.decode={decode}")
    train, _ = open_splits(cfg.data, Topology())
    made = make_loader(cfg.data, train, facts_on(cfg, Topology(), CPU), seed=cfg.run.seed, train=True)
    assert made.dataset.encoded is on_device and made.device == CPU
