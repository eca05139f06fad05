"""The typed shape of a run's configuration, and the checks every value passes before any work starts.

Hydra composes YAML from the groups beside this file onto these dataclasses, so a value of the wrong type is
refused at composition; `validate` then checks ranges, choices and the MLPerf closed-division rules and
raises `ConfigError` naming the key and what is allowed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from configs.checks import ConfigError, one_of, positive, require
from configs.device import sections
from configs.device.base import DeviceConfig
from configs.device.native import NativeConfig
from configs.fingerprint import fingerprint, not_training, not_training_section, training, training_section
from configs.shape import BatchShape, nearest_multiple
from data.config import DataConfig
from data.config import validate as validate_data
from mlperf_logs.config import MlperfConfig, validate_closed_division, validate_mlperf
from monitor.config import PROGRESS_MODES
from optim.config import OptimConfig, PrecisionConfig, validate_optim, validate_precision

if TYPE_CHECKING:
    from _typeshed import DataclassInstance


class UnknownKey(ConfigError):
    """A key the schema does not have, added with `+key=value` (Hydra refuses the others while composing)."""

    def __init__(self, key: str, message: str = "no such key") -> None:
        super().__init__(key, message)


@dataclass
class ModelConfig:
    """ResNet-50 v1.5, the only model MLPerf's ResNet benchmark trains (the group option's name says so); its keys
    are the initialisation and BatchNorm settings the rules leave open."""

    zero_init_residual: bool = training(True)  # zero-initialised last BN gamma in each residual block
    bn_momentum: float = training(0.1)  # PyTorch convention (TF reference: 0.9)
    bn_eps: float = training(1e-5)


@dataclass
class DistConfig:
    grad_accum: int = training(1)  # micro-batches per weight update
    # consecutive ranks whose BatchNorm statistics are reduced together (the BN span)
    bn_group_size: int = training(1)
    bucket_mb: float | None = training(None)  # gradient all-reduce bucket size in MB; None: one bucket
    overlap: bool = training(False)  # launch each bucket's all-reduce during backward, as soon as it is full
    timeout_s: float = training(300.0)  # a collective that waits longer fails, and the run stops naming the rank


@dataclass
class RunConfig:
    # train | benchmark (time the step) | project (time to train on a device it projects)
    mode: str = not_training("train")
    seed: int = training(1)
    max_epochs: int = training(40)
    # none | auto: continue from the checkpoint in the output directory, if there is one
    resume: str = not_training("none")
    checkpoint: bool = not_training(True)  # write a checkpoint at each epoch end
    # and every this many steps within an epoch too (0: at epoch ends only)
    checkpoint_every_steps: int = not_training(0)
    progress: str = not_training("auto")  # auto (bar on a terminal, lines otherwise) | bar | lines | none
    benchmark_steps: int = not_training(20)  # run.mode=benchmark: timed train steps on random in-memory batches
    # rank 0 writes TensorBoard scalars into the run directory (tensorboard --logdir outputs)
    tensorboard: bool = not_training(True)
    # a run that ends short of the target exits 0, not NOT_CONVERGED (3)
    allow_not_converged: bool = not_training(False)


@dataclass
class Config:
    model: ModelConfig = training_section(ModelConfig)
    data: DataConfig = training_section(DataConfig)
    optim: OptimConfig = training_section(OptimConfig)
    precision: PrecisionConfig = training_section(PrecisionConfig)
    device: DeviceConfig = not_training_section(NativeConfig)  # the host's CPU, as configs/device/cpu.yaml
    dist: DistConfig = training_section(DistConfig)
    mlperf: MlperfConfig = not_training_section(MlperfConfig)
    run: RunConfig = training_section(RunConfig)


def register() -> None:
    """Make the schema the base of configs/config.yaml (its defaults list names `schema`)."""
    config_store = ConfigStore.instance()
    # The device's section is left to the device option, whose defaults name its family's: a node already typed
    # as the CPU's NativeConfig would refuse to become a GPU cluster's ClusterConfig.
    config_store.store(name="schema", node=Config(device=DeviceConfig()))
    sections.store(config_store)


def composed(overrides: Sequence[str], world_size: int = 1) -> Config:
    """configs/config.yaml with `overrides`, composed and checked as train.py does it on `world_size` ranks: what
    a tool that reads train.py's runs (the planner) composes, and the tests."""
    register()
    with initialize_config_dir(config_dir=str(Path(__file__).resolve().parent), version_base="1.3"):
        cfg = OmegaConf.to_object(compose("config", overrides=list(overrides)))
    assert isinstance(cfg, Config)
    validate(cfg, world_size)
    return cfg


def batch_shape(cfg: Config, world_size: int) -> BatchShape:
    """The run's batch shape on `world_size` ranks."""
    return BatchShape(
        cfg.data.global_batch,
        world_size,
        cfg.device.replica_count(world_size),
        cfg.dist.grad_accum,
        cfg.device.bn_group_of(cfg.dist.bn_group_size),
    )


def _no_added_keys(section: DataclassInstance, prefix: str = "") -> None:
    """Refuse a key that `+key=value` added to the schema: Hydra composes it, and OmegaConf.to_object keeps it as
    an attribute that nothing reads."""
    known = {item.name for item in fields(section)}
    for name, value in vars(section).items():
        if name not in known:
            raise UnknownKey(prefix + name)
        if is_dataclass(value) and not isinstance(value, type):
            _no_added_keys(value, f"{prefix}{name}.")


def validate(cfg: Config, world_size: int = 1) -> BatchShape:
    """Check every value a user can set; raise ConfigError for the first one that is wrong. Returns the run's batch
    shape on `world_size` ranks, worked out here once."""
    _no_added_keys(cfg)
    _validate_model(cfg.model)
    validate_data(cfg.data, reads_files=cfg.run.mode == "train")
    validate_optim(cfg.optim, cfg.run.max_epochs)
    validate_precision(cfg.precision)
    cfg.device.computes(cfg.precision)  # a precision the device cannot compute in is refused here
    _validate_dist(cfg.dist, world_size, bn_groups_of_ranks=not cfg.device.simulated)
    shape = batch_shape(cfg, world_size)
    sections.check_section(cfg.device)
    cfg.device.validate(cfg.dist.bn_group_size, shape)
    _validate_batch(shape, cfg.device)
    validate_mlperf(cfg.mlperf)
    require(
        cfg.mlperf.clock == "wall" or cfg.device.simulated,
        "mlperf.clock",
        "device time is a simulated system's: it needs device=ipu_pod16, ipu_pod64, ..., tpu_v4, ...",
    )
    if cfg.mlperf.division == "closed":
        validate_closed_division(cfg.optim, cfg.data.global_batch, cfg.mlperf.target_accuracy)
    _validate_run(cfg.run)
    require(
        cfg.run.mode != "project" or cfg.device.projected,
        "run.mode",
        "project times a simulated IPU system, a GPU cluster or a TPU slice: add device=ipu_pod16, ..., dgx_h100,"
        " ..., tpu_v4, ...",
    )
    if cfg.run.mode != "project" and (why := cfg.device.only_projected()) is not None:
        raise ConfigError("device", why)
    return shape


def _validate_batch(shape: BatchShape, device: DeviceConfig) -> None:
    """The one rule of how a global batch deals: the same whole number of images to each micro-batch of every
    replica (a rank's, a simulated IPU replica's, or a projected GPU's)."""
    step = shape.replicas * shape.grad_accum
    require(
        shape.global_batch % step == 0,
        "data.global_batch",
        f"{shape.global_batch} images do not deal evenly to {shape.replicas} {device.dealt_to} x dist.grad_accum "
        f"{shape.grad_accum}; the nearest that does is data.global_batch={nearest_multiple(shape.global_batch, step)}",
    )


def _validate_model(model: ModelConfig) -> None:
    require(0 < model.bn_momentum < 1, "model.bn_momentum", f"must be in (0, 1), got {model.bn_momentum}")
    positive(model.bn_eps, "model.bn_eps")


def _validate_dist(d: DistConfig, world_size: int, bn_groups_of_ranks: bool = True) -> None:
    require(d.grad_accum >= 1, "dist.grad_accum", f"must be 1 or more, got {d.grad_accum}")
    if bn_groups_of_ranks:
        require(
            d.bn_group_size >= 1 and world_size % d.bn_group_size == 0,
            "dist.bn_group_size",
            f"must divide the world size ({world_size} ranks), got {d.bn_group_size}",
        )
    if d.bucket_mb is not None:
        positive(d.bucket_mb, "dist.bucket_mb")
    positive(d.timeout_s, "dist.timeout_s")


def _validate_run(run: RunConfig) -> None:
    one_of(run.mode, "run.mode", ("train", "benchmark", "project"))
    positive(run.benchmark_steps, "run.benchmark_steps")
    require(run.max_epochs >= 1, "run.max_epochs", f"must be 1 or more, got {run.max_epochs}")
    require(run.seed >= 0, "run.seed", f"must be 0 or more, got {run.seed}")
    one_of(run.resume, "run.resume", ("none", "auto"))
    one_of(run.progress, "run.progress", PROGRESS_MODES)
    every = run.checkpoint_every_steps
    require(every >= 0, "run.checkpoint_every_steps", f"must be 0 (epoch ends only) or more, got {every}")
    require(run.checkpoint or not every, "run.checkpoint_every_steps", "needs run.checkpoint=true")


def training_fingerprint(cfg: Config, world_size: int) -> dict[str, object]:
    """The settings a checkpoint must share with the run that resumes it, as dotted keys, and the world size.

    Each field of the config says whether it changes the arithmetic of training (configs/fingerprint.py): the
    model, optim, precision and dist sections, the data keys that shape the images and the batch (the synthetic
    set's where the run trains on it), the seed and the epoch budget are in; where it runs and how fast (device,
    loader workers, evaluation batch, progress display, data path) and what the MLPerf log says are out.
    """
    return fingerprint(cfg) | {"world_size": world_size}
