"""data.decode=gpu's decoder, run on the CPU device against the fused decoder: the same boxes, close pixels."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from data import jpeg
from data.device_decode import decode_crops
from data.transforms import Box, centre_crop_box, random_resized_crop_box
from tests import jpeg_samples

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
