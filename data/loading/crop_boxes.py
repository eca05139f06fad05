"""Crop boxes drawn from an image's size alone, so a loader can decode only the box (the fused-decoder seam).

A box is (top, left, height, width) in original pixels, as `data.jpeg.decode_crop` takes it.
"""

from __future__ import annotations

import threading

import torch
from torchvision.transforms import RandomResizedCrop

Box = tuple[int, int, int, int]

CROP_RATIO = (3 / 4, 4 / 3)  # the MLPerf reference's aspect-ratio range
# One draw at a time: the producer thread (data.loading.feeder) draws crops in the training process when it reads the
# files itself (data.workers=0), and two draws interleaved on the one global generator would swap their numbers.
_GLOBAL_GENERATOR = threading.Lock()


def random_resized_crop_box(height: int, width: int, area_min: float, seed: int) -> tuple[Box, bool]:
    """torchvision's RandomResizedCrop parameters (10 tries, then a centre crop) and a coin for the flip.

    torchvision draws from torch's global generator: the draw reseeds it from `seed` and puts its state back
    after, so each sample's box depends on its own seed only, whatever process, worker or thread draws it.
    (Seeding the CPU generator alone takes microseconds; torch.manual_seed, which seeds every device too, hundreds.)
    """
    generator = torch.default_generator
    shape_only = torch.empty(()).expand(1, height, width)  # get_params reads the size, never the pixels
    with _GLOBAL_GENERATOR:
        state = generator.get_state()
        generator.manual_seed(seed)
        try:
            top, left, h, w = RandomResizedCrop.get_params(shape_only, scale=[area_min, 1.0], ratio=list(CROP_RATIO))
            flip = bool(torch.rand(()) < 0.5)
        finally:
            generator.set_state(state)
    return (top, left, h, w), flip


def centre_crop_box(height: int, width: int, resize: int, size: int) -> Box:
    """The box that 'resize the short side to `resize`, centre-crop `size` x `size`' keeps, in original pixels."""
    side = min(height, width) * size / resize
    side_px = max(1, round(side))
    top = round((height - side) / 2)
    left = round((width - side) / 2)
    return top, left, min(side_px, height - top), min(side_px, width - left)
