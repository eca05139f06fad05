"""The run's data as train.py and the benches open it: both splits' indexes (made by rank 0 first) and the
loaders that deal this rank its share of each batch."""

from __future__ import annotations

import math
from typing import Protocol

import torch

import distributed
from configs.checks import ConfigError
from configs.shape import BatchShape
from data.config import DataConfig
from data.datasets import open_dataset
from data.loading import decode_choice
from data.loading.loader import Crops, Loader, build_loader, workers_for_cores
from data.loading.sampler import ShardedSampler
from data.sources.split import Split
from distributed import Topology


class Placement(Protocol):
    """What a loader needs of the run's facts (backends.base.RunFacts, which data/ does not import): this rank of
    the launch, the device its batches go to, and how each global batch is dealt."""

    @property
    def topology(self) -> Topology: ...

    @property
    def device(self) -> torch.device: ...

    @property
    def shape(self) -> BatchShape: ...


def open_splits(data: DataConfig, topology: Topology) -> tuple[Split, Split]:
    """Rank 0 opens the dataset first (generating the synthetic set, its index or its shards on first use), then
    the other ranks, which find them made."""
    splits = open_dataset(data.name, data.root, data.synthetic, data.format) if topology.is_main else None
    distributed.barrier()
    return splits or open_dataset(data.name, data.root, data.synthetic, data.format)


def make_loader(data: DataConfig, split: Split, place: Placement, *, seed: int, train: bool) -> Loader:
    """The training loader (this rank's share of each global batch, shuffled by `seed`) or the evaluation one, for
    batches bound to this rank's device (pinned for a GPU). A training set too small for one global batch is
    refused: its epochs would have no step."""
    topology, device = place.topology, place.device
    if train and len(split) < data.global_batch:
        raise ConfigError("data.global_batch", too_few_images(len(split), place.shape))
    crops = Crops(train=train, size=data.image_size, area_min=data.crop_area_min, eval_resize=data.eval_resize)
    sampler = ShardedSampler(
        len(split),
        seed=seed,
        shuffle=train,
        global_batch=data.global_batch,
        rank=topology.rank,
        world_size=topology.world_size,
    )
    return build_loader(
        split,
        crops,
        sampler,
        batch=place.shape.per_rank if train else data.eval_batch,
        workers=loader_workers(data, topology),
        pin_memory=device.type == "cuda",
        corrupt=data.corrupt,
        max_skipped=data.max_skipped,
        max_pixels=data.max_pixels,
        cache_bytes=data.cache_bytes,
        device=device,
        device_share=device_share(data),
    )


def device_share(data: DataConfig) -> float | None:
    """The share of each batch the training device decodes as data.decode pins it (None: the workers decode it
    all). data.decode=auto starts with the workers, until data.loading.decode_choice has timed both."""
    return {"gpu": 1.0, "hybrid": data.device_share}.get(data.decode)


def too_few_images(images: int, shape: BatchShape) -> str:
    """What to say of a training set of `images` smaller than the global batch: the largest batch that fits it, a
    power of two times what the batch must divide into (ranks x gradient accumulation)."""
    global_batch, divisor = shape.global_batch, shape.ranks * shape.grad_accum
    fits = divisor * 2 ** int(math.log2(images // divisor)) if images >= divisor else None
    advice = f"give data.global_batch={fits} (or fewer)" if fits else f"the set needs at least {divisor} images"
    return f"{global_batch} is more than the {images} training images: an epoch would have no step; {advice}"


def loader_workers(data: DataConfig, topology: Topology) -> int:
    """data.workers, or where it is null, this rank's share of the machine's cores less one."""
    return data.workers if data.workers is not None else workers_for_cores(topology.local_world_size)


def decode_where_fastest(data: DataConfig, loaders: tuple[Loader, ...], place: Placement) -> str | None:
    """data.decode=auto on a CUDA device: both decoders timed on the training set (data.loading.decode_choice), and the
    loaders set to the share that feeds most before their first batch; the line that says what was chosen and
    why. None where nothing was timed: the decode pinned, or a device that is the training process's own CPU."""
    if data.decode != "auto" or place.device.type != "cuda":
        return None
    workers = loader_workers(data, place.topology)
    rates = decode_choice.measure(loaders[0].dataset, place.shape.per_rank, workers, place.device)
    choice = decode_choice.choose(rates)
    for loader in loaders:
        loader.decode_on_device(choice.share)
    return choice.line
