"""Builds a run's parts other than its backend (backends.build.from_config) from the config and the run's facts
(backends.build.run_facts): seeds, data, schedule and what the MLPerf log says of them. train.py and benchmark.py
share them here, since nothing imports train.py."""

from __future__ import annotations

import math
import random

import numpy as np
import torch

import distributed
from backends.base import RunFacts
from configs.checks import ConfigError
from configs.schema import Config
from configs.shape import BatchShape
from data.datasets import dataset_size, open_dataset
from data.loader import Crops, Loader, build_loader, workers_for_cores
from data.sampler import ShardedSampler
from data.split import Split
from distributed import Topology
from mlperf_logs.hyperparameters import Hyperparameters
from optim.precision import Policy
from optim.schedule import Schedule, steps_from_epochs


def seed_everything(seed: int, rank: int) -> None:
    """One seed drives Python, NumPy and torch; each rank offsets it."""
    random.seed(seed + rank)
    np.random.seed(seed + rank)
    torch.manual_seed(seed + rank)


def dataset_shape(cfg: Config) -> tuple[int, int, int]:
    """Classes, training and validation images of the configured dataset, without reading it."""
    return dataset_size(cfg.data.name, cfg.data.synthetic)


def open_splits(cfg: Config, topology: Topology) -> tuple[Split, Split]:
    """Rank 0 opens the dataset first (generating the synthetic set, its index or its shards on first use), then
    the other ranks, which find them made."""
    data = cfg.data
    splits = open_dataset(data.name, data.root, data.synthetic, data.format) if topology.is_main else None
    distributed.barrier()
    return splits or open_dataset(data.name, data.root, data.synthetic, data.format)


def make_loader(cfg: Config, split: Split, facts: RunFacts, *, train: bool) -> Loader:
    """The training loader (this rank's share of each global batch, shuffled) or the evaluation one, for batches
    bound to this rank's device (pinned for a GPU). A training set too small for one global batch is refused: its
    epochs would have no step."""
    data, topology, device = cfg.data, facts.topology, facts.device
    if train and len(split) < data.global_batch:
        raise ConfigError("data.global_batch", too_few_images(len(split), facts.shape))
    crops = Crops(train=train, size=data.image_size, area_min=data.crop_area_min, eval_resize=data.eval_resize)
    sampler = ShardedSampler(
        len(split),
        seed=cfg.run.seed,
        shuffle=train,
        global_batch=data.global_batch,
        rank=topology.rank,
        world_size=topology.world_size,
    )
    return build_loader(
        split,
        crops,
        sampler,
        batch=facts.shape.per_rank if train else data.eval_batch,
        workers=loader_workers(cfg, topology),
        pin_memory=device.type == "cuda",
        corrupt=data.corrupt,
        max_pixels=data.max_pixels,
        cache_bytes=data.cache_bytes,
        device=device,
        decode_on_device=data.decode == "gpu",
    )


def too_few_images(images: int, shape: BatchShape) -> str:
    """What to say of a training set of `images` smaller than the global batch: the largest batch that fits it, a
    power of two times what the batch must divide into (ranks x gradient accumulation)."""
    global_batch, divisor = shape.global_batch, shape.ranks * shape.grad_accum
    fits = divisor * 2 ** int(math.log2(images // divisor)) if images >= divisor else None
    advice = f"give data.global_batch={fits} (or fewer)" if fits else f"the set needs at least {divisor} images"
    return f"{global_batch} is more than the {images} training images: an epoch would have no step; {advice}"


def loader_workers(cfg: Config, topology: Topology) -> int:
    """data.workers, or where it is null, this rank's share of the machine's cores less one."""
    return cfg.data.workers if cfg.data.workers is not None else workers_for_cores(topology.local_world_size)


def eval_epochs(max_epochs: int, first: int, every: int) -> set[int]:
    """The MLPerf schedule: every `every` epochs starting at `first`, and the last epoch of the budget."""
    return set(range(first, max_epochs + 1, every)) | {max_epochs}


def make_schedule(cfg: Config, steps_per_epoch: int) -> Schedule:
    optim = cfg.optim
    warmup_steps = steps_from_epochs(optim.warmup_epochs, steps_per_epoch)
    decay_epochs = optim.decay_epochs or cfg.run.max_epochs - optim.warmup_epochs
    return Schedule(
        base_lr=optim.base_lr,
        warmup_steps=warmup_steps,
        decay_steps=max(1, steps_from_epochs(decay_epochs, steps_per_epoch)),
        end_lr=optim.end_lr,
        power=optim.poly_power,
    )


def hyperparameters(
    cfg: Config, schedule: Schedule, shape: BatchShape, train_split: Split, val_split: Split
) -> Hyperparameters:
    return Hyperparameters(
        optimizer=cfg.optim.name,
        global_batch=cfg.data.global_batch,
        grad_accum=cfg.dist.grad_accum,
        bn_span=shape.bn_span,
        train_samples=len(train_split),
        eval_samples=len(val_split),
        base_lr=cfg.optim.base_lr,
        end_lr=cfg.optim.end_lr,
        poly_power=cfg.optim.poly_power,
        decay_steps=schedule.decay_steps,
        warmup_epochs=cfg.optim.warmup_epochs,
        momentum=cfg.optim.momentum,
        weight_decay=cfg.optim.weight_decay,
    )


def submission_platform(cfg: Config, policy: Policy) -> str:
    """The platform the log names; a log in simulated device time, or of emulated 16-bit arithmetic, says so."""
    system = cfg.device.system
    if cfg.mlperf.clock == "device" and system is not None:  # validate: device time is a simulated system's
        return f"{system.name} simulated by rn50perf ipu_sim (device time)"
    return cfg.mlperf.platform + (f" ({policy.compute} emulated in fp32)" if policy.emulated else "")
