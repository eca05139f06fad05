"""Batches of uint8 NHWC images: read the file, draw the crop box from the header size, decode only the box."""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from data.decode import DecodeError, decode_crop, image_size
from data.folder import DatasetError, Split
from data.sampler import ShardedSampler
from data.transforms import centre_crop_box, random_resized_crop_box

Batch = tuple[torch.Tensor, torch.Tensor]


class CropDataset(Dataset):
    """One split, indexed by (dataset index, sample seed) as `ShardedSampler` yields them.

    Training samples a random-resized crop and a flip from the sample seed; evaluation resizes the short
    side to `eval_resize` and centre-crops, both expressed as a box in original pixels.
    """

    def __init__(self, split: Split, *, train: bool, size: int, area_min: float, eval_resize: int) -> None:
        self.split = split
        self.train = train
        self.size = size
        self.area_min = area_min
        self.eval_resize = eval_resize

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, item: tuple[int, int]) -> tuple[np.ndarray, int]:
        index, seed = item
        path = self.split.paths[index]
        data = path.read_bytes()
        try:
            height, width = image_size(data)
            if self.train:
                generator = torch.Generator().manual_seed(seed)
                box = random_resized_crop_box(height, width, self.area_min, generator)
                flip = bool(torch.rand((), generator=generator) < 0.5)
            else:
                box, flip = centre_crop_box(height, width, self.eval_resize, self.size), False
            image = decode_crop(data, box, (self.size, self.size), flip)
        except DecodeError as err:
            raise DatasetError(f"{path}: {err}") from err
        return image, self.split.labels[index]


def collate(samples: list[tuple[np.ndarray, int]]) -> Batch:
    images = torch.from_numpy(np.stack([image for image, _ in samples]))
    labels = torch.tensor([label for _, label in samples], dtype=torch.int64)
    return images, labels


def build_loader(
    dataset: CropDataset,
    sampler: ShardedSampler,
    *,
    batch: int,
    workers: int,
    pin_memory: bool = False,
) -> DataLoader:
    """A loader of full (training) or trailing-partial (evaluation) batches of uint8 NHWC images."""
    return DataLoader(
        dataset,
        batch_size=batch,
        sampler=sampler,
        num_workers=workers,
        collate_fn=collate,
        pin_memory=pin_memory,
        drop_last=dataset.train,
        persistent_workers=workers > 0,
        prefetch_factor=4 if workers > 0 else None,
    )
