"""Builds a run's parts from the config for every run.mode: train.py, benchmark.py and projection.py share them
here, since nothing imports train.py."""

from __future__ import annotations

import random
from functools import partial

import numpy as np
import torch

import backends
import distributed
from backends.ipu_sim import simulator
from configs.schema import Config, ConfigError
from data.datasets import dataset_size, open_dataset
from data.loader import Crops, Loader, build_loader
from data.sampler import ShardedSampler
from data.split import Split
from data.synthetic import SyntheticSpec
from distributed import Topology
from distributed.batchnorm import DistributedBatchNorm2d
from mlperf_logs.hyperparameters import Hyperparameters
from models import batchnorm, build_resnet50
from models.resnet import NormLayer
from optim import Schedule, build_optimizer
from optim.precision import Policy, emulates
from optim.schedule import steps_from_epochs


def seed_everything(seed: int, rank: int) -> None:
    """One seed drives Python, NumPy and torch; each rank offsets it."""
    random.seed(seed + rank)
    np.random.seed(seed + rank)
    torch.manual_seed(seed + rank)


def select_device(name: str, threads: int, local_rank: int = 0) -> torch.device:
    """The CPU, or the GPU of this rank's local rank."""
    if threads:
        torch.set_num_threads(threads)
    if name in ("cpu", "ipu_sim"):  # the simulated IPU runs on the host
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError("device.name", "cuda was asked for but no CUDA device is available (use device=cpu)")
    if local_rank >= torch.cuda.device_count():
        raise ConfigError("device.name", f"local rank {local_rank} has no GPU ({torch.cuda.device_count()} here)")
    return torch.device("cuda", local_rank)


def precision_policy(cfg: Config, device: torch.device) -> Policy:
    p = cfg.precision
    return Policy(
        name=p.name,
        compute=p.compute,
        master=p.master,
        stochastic_rounding=p.stochastic_rounding,
        loss_scaling=p.loss_scaling,
        init_scale=p.init_scale,
        growth_interval=p.growth_interval,
        emulate=emulates(p.compute, p.emulate, device.type),
    )


def dataset_shape(cfg: Config) -> tuple[int, int, int]:
    """Classes, training and validation images of the configured dataset, without reading it."""
    return dataset_size(cfg.data.name, SyntheticSpec(**vars(cfg.data.synthetic)))


def open_splits(cfg: Config, topology: Topology) -> tuple[Split, Split]:
    """Rank 0 opens the dataset first (generating the synthetic set, its index or its shards on first use), then
    the other ranks, which find them made."""
    data = cfg.data
    spec = SyntheticSpec(**vars(data.synthetic))
    splits = open_dataset(data.name, data.root, spec, data.format) if topology.is_main else None
    distributed.barrier()
    return splits or open_dataset(data.name, data.root, spec, data.format)


def make_loader(
    cfg: Config, split: Split, topology: Topology, *, train: bool, batch: int, device: torch.device
) -> Loader:
    data = cfg.data
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
        batch=batch,
        workers=data.workers,
        pin_memory=device.type == "cuda",
        corrupt=data.corrupt,
        max_pixels=data.max_pixels,
        cache_bytes=data.cache_bytes,
    )


def build_backend(
    cfg: Config, classes: int, device: torch.device, topology: Topology, policy: Policy
) -> backends.Backend:
    """ResNet-50, LARS or SGD with the MLPerf parameter groups, and the precision policy, bound to `device`; on a
    simulated IPU system, once its memory plan fits, with the system's clock."""
    model = build_model(cfg, classes)
    clock = ipu_clock(cfg, model, announce=topology.is_main) if cfg.device.name == "ipu_sim" else None
    optimizer = build_optimizer(
        cfg.optim.name,
        model,
        lr=cfg.optim.base_lr,
        momentum=cfg.optim.momentum,
        weight_decay=cfg.optim.weight_decay,
        eta=cfg.optim.eta,
    )
    return backends.build(
        cfg.device.name if cfg.device.name == "ipu_sim" else str(device),
        model,
        optimizer,
        label_smoothing=cfg.optim.label_smoothing,
        grad_accum=cfg.dist.grad_accum,
        policy=policy,
        seed=cfg.run.seed * 1_000_003,  # one rounding stream on every rank: replicas keep identical weights
        bucket_mb=cfg.dist.bucket_mb,
        overlap=cfg.dist.overlap,
        replicas=cfg.device.replicas // topology.world_size,
        bn_group=cfg.dist.bn_group_size,
        clock=clock,
        pipeline_splits=cfg.device.pipeline_splits,
    )


def build_model(cfg: Config, classes: int) -> torch.nn.Module:
    """ResNet-50 with the configured norm layer; pipeline splits must cut it where one tensor crosses."""
    model = build_resnet50(classes, norm_layer(cfg), cfg.model.zero_init_residual, cfg.device.channels_last)
    check_module_names(model, cfg.device.pipeline_splits, "device.pipeline_splits")
    if cfg.device.pipeline_splits:
        try:
            simulator.check_splits(model, cfg.device.pipeline_splits)
        except ValueError as err:  # e.g. a cut inside a residual block, where two tensors cross
            raise ConfigError("device.pipeline_splits", str(err)) from err
    return model


def check_module_names(model: torch.nn.Module, names: list[str], key: str) -> None:
    modules = dict(model.named_modules())
    for name in names:
        if name not in modules:
            examples = ", ".join([*list(modules)[1:4], "layer2", "layer3.2"])
            raise ConfigError(key, f"{name!r} is not a module of the model (e.g. {examples})")


def norm_layer(cfg: Config) -> NormLayer:
    """BatchNorm2d, or DistributedBatchNorm2d when statistics span several ranks."""
    model = cfg.model
    if cfg.dist.bn_group_size == 1 or cfg.device.name == "ipu_sim":  # ipu_sim groups replicas' micro-batches
        return batchnorm(model.bn_momentum, model.bn_eps)
    return partial(
        DistributedBatchNorm2d, group_size=cfg.dist.bn_group_size, eps=model.bn_eps, momentum=model.bn_momentum
    )


def bn_span(cfg: Config, world_size: int) -> int:
    """The images one BatchNorm's statistics cover: the micro-batch times the replicas (ranks, or simulated
    IPU replicas) in its group."""
    replicas = cfg.device.replicas if cfg.device.name == "ipu_sim" else world_size
    return cfg.data.global_batch // (replicas * cfg.dist.grad_accum) * cfg.dist.bn_group_size


def ipu_layout(cfg: Config) -> simulator.Layout:
    """The run's layout on the simulated IPU system, as the probe, the memory plan and the cost model read it."""
    device = cfg.device
    return simulator.Layout(
        replicas=device.replicas,
        micro_batch=cfg.data.global_batch // (device.replicas * cfg.dist.grad_accum),
        grad_accum=cfg.dist.grad_accum,
        image_size=cfg.data.image_size,
        splits=tuple(device.pipeline_splits),
        recompute=device.recompute,
        device_iterations=device.device_iterations,
        optimizer_state=device.optimizer_state,
        input_8bit=device.input_8bit,
        compute=cfg.precision.compute,
        master=cfg.precision.master,
        merged_allreduce=cfg.dist.bucket_mb is None,
    )


def ipu_plan(cfg: Config, model: torch.nn.Module) -> simulator.Plan:
    """Probe one micro-batch of `model` on the host and plan each IPU's memory."""
    try:
        return simulator.plan(model, ipu_layout(cfg), cfg.device.system)
    except ValueError as err:  # a split or recomputation checkpoint the model does not run
        raise ConfigError("device", str(err)) from err


def ipu_clock(cfg: Config, model: torch.nn.Module, announce: bool) -> simulator.DeviceClock:
    """The simulated system's clock for a run whose memory plan fits; an oversubscribed plan is refused with the
    per-IPU table."""
    plan = ipu_plan(cfg, model)
    try:
        return simulator.clock(plan, cfg.device.system, announce)
    except simulator.OutOfMemory as err:
        raise ConfigError("device", str(err)) from err


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
    cfg: Config, schedule: Schedule, world_size: int, train_split: Split, val_split: Split
) -> Hyperparameters:
    return Hyperparameters(
        optimizer=cfg.optim.name,
        global_batch=cfg.data.global_batch,
        grad_accum=cfg.dist.grad_accum,
        bn_span=bn_span(cfg, world_size),
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
    if cfg.mlperf.clock == "device":
        return f"{cfg.device.system.name} simulated by rn50perf ipu_sim (device time)"
    return cfg.mlperf.platform + (f" ({policy.compute} emulated in fp32)" if policy.emulate else "")
