"""The typed shape of a run's configuration, and the checks every value passes before any work starts.

Hydra composes YAML from the groups beside this file onto these dataclasses, so a value of the wrong type is
refused at composition; `validate` then checks ranges, choices and the MLPerf closed-division rules and
raises `ConfigError` naming the key and what is allowed.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hydra.core.config_store import ConfigStore

from configs.hardware import OPTIMIZER_STATES, System
from data.datasets import DATASETS, FORMATS
from data.loader import CORRUPT_POLICIES, DECODERS
from data.synthetic import MAX_CLASSES
from mlperf_logs.progress import PROGRESS_MODES
from optim import OPTIMIZERS
from optim.precision import DTYPES, EMULATE, LOSS_SCALING, PrecisionConfig

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

DEVICES = ("cpu", "cuda", "ipu_sim")  # what backends.BACKENDS dispatches on; ipu_sim: a simulated IPU system


class ConfigError(ValueError):
    """A configuration value a user can fix: `key` names it, the message says what is allowed."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key
        self.message = message

    def __reduce__(self) -> tuple[type, tuple[str, str]]:  # rank 0 sends its errors to the other ranks
        return type(self), (self.key, self.message)


class UnknownKey(ConfigError):
    """A key the schema does not have, added with `+key=value` (Hydra refuses the others while composing)."""

    def __init__(self, key: str, message: str = "no such key") -> None:
        super().__init__(key, message)


@dataclass
class ModelConfig:
    name: str = "resnet50"
    zero_init_residual: bool = True  # zero-initialised last BN gamma in each residual block
    bn_momentum: float = 0.1  # PyTorch convention (TF reference: 0.9)
    bn_eps: float = 1e-5


@dataclass
class SyntheticConfig:
    classes: int = 10
    train_per_class: int = 100
    val_per_class: int = 50
    seed: int = 0


@dataclass
class DataConfig:
    name: str = "synthetic"  # synthetic | imagenet
    root: str | None = None  # None: the synthetic set's cache directory
    # files: a folder tree (torchvision's, Kaggle's or image-net.org's layout, recognised from what is there) |
    # shards: indexed tar shards written by `python -m data.shards` (root: their folder; synthetic: packed on first use)
    format: str = "files"
    image_size: int = 224  # training and evaluation crop, pixels
    eval_resize: int = 256  # evaluation resizes the short side to this, then centre-crops image_size
    crop_area_min: float = 0.08  # random-resized crop: smallest fraction of the image area
    global_batch: int = 256
    eval_batch: int = 256
    workers: int | None = None  # loader processes per rank; 0 loads in the training process; null: this rank's
    # share of the machine's cores, less one for the training process (data.loader.workers_for_cores)
    corrupt: str = "skip"  # skip: replace an unreadable or corrupt file by another sample, report it once | fail
    max_pixels: int = 178_956_970  # refuse an image whose header claims more pixels (Pillow's bomb limit)
    cache_bytes: bool = False  # keep every file's bytes in memory (read once, shared by the workers)
    # cpu: the fused decoder in the workers | gpu: the workers read the bytes and draw the crops, the training
    # device decodes (nvJPEG on CUDA; on device=cpu the training process, which is how the tests run it)
    decode: str = "cpu"
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)


@dataclass
class OptimConfig:
    name: str = "lars"  # lars | sgd
    base_lr: float = 10.0
    momentum: float = 0.9
    weight_decay: float = 5e-5
    eta: float = 0.001  # LARS trust coefficient
    warmup_epochs: float = 2.0
    decay_epochs: float | None = None  # None: from the end of warm-up to run.max_epochs
    end_lr: float = 1e-4
    poly_power: float = 2.0
    label_smoothing: float = 0.1


@dataclass
class DeviceConfig:
    name: str = "cpu"  # cpu | cuda | ipu_sim
    threads: int = 0  # torch intra-op threads; 0 keeps torch's default
    channels_last: bool = False
    foreach: bool | None = None  # the optimizer step as multi-tensor ops over all parameters; None: on CUDA only
    # native 16-bit compute: BatchNorm takes the 16-bit activations as they are (statistics and weights in fp32
    # inside its kernel) instead of a copy cast to fp32 first; None: on CUDA only
    bn_16bit_input: bool | None = None
    compile: bool = False  # torch.compile the model (its forward and backward; the first steps compile)
    pad_input_channels: bool = False  # the first convolution over 4 channels, a zero one added (cuDNN's fp16)
    cuda_graphs: bool = False  # the train step captured once in a CUDA graph and replayed (where it can be)
    system: System | None = None  # ipu_sim: the simulated IPU system (configs/device/<system>.yaml)
    # ipu_sim only: how a run is laid out on the system (the names of Graphcore's PopTorch documentation)
    replicas: int = 1  # data-parallel copies of the model, over all ranks (each rank runs its share)
    pipeline_splits: list[str] = field(default_factory=list)  # module names that begin pipeline stages 2, 3, ...
    device_iterations: int | None = None  # weight updates per host round trip; None: 5 round trips an epoch, as
    # Graphcore's MLPerf train.py (one per log interval)
    recompute: str = "none"  # none | auto | module names whose outputs are checkpoints, comma-separated
    optimizer_state: str = "on_chip"  # on_chip | streaming (off-chip DDR)
    input_8bit: bool = True  # images cross the host link as uint8 and are normalised on the device


# The config's options for speed on a native device, as dotted keys: the GPU check (bench/gpu/step.py) times the
# step with all of them off, then with each one on alone. An option added for speed joins this list.
SPEED_OPTIONS = (
    "device.channels_last",
    "device.foreach",
    "device.bn_16bit_input",
    "device.compile",
    "device.pad_input_channels",
    "device.cuda_graphs",
)


@dataclass
class DistConfig:
    grad_accum: int = 1  # micro-batches per weight update
    bn_group_size: int = 1  # consecutive ranks whose BatchNorm statistics are reduced together (the BN span)
    bucket_mb: float | None = None  # gradient all-reduce bucket size in MB; None: one bucket
    overlap: bool = False  # launch each bucket's all-reduce during backward, as soon as it is full
    timeout_s: float = 300.0  # a collective that waits longer fails, and the run stops naming the rank


@dataclass
class MlperfConfig:
    division: str = "closed"  # closed | open
    status: str = "onprem"  # cloud | onprem | preview | research
    org: str = "rn50perf"
    platform: str = "cpu"
    target_accuracy: float = 0.759
    eval_every: int = 4  # epochs between evaluations
    first_eval: int = 4  # epoch of the first evaluation, 1 to eval_every
    log_file: str = "mlperf.log"
    clock: str = "wall"  # wall | device: ipu_sim's simulated device time (submission_platform then says so)


@dataclass
class RunConfig:
    mode: str = "train"  # train | benchmark (time the step) | project (ipu_sim: memory plan and time-to-train)
    seed: int = 1
    max_epochs: int = 40
    resume: str = "none"  # none | auto: continue from the checkpoint in the output directory, if there is one
    checkpoint: bool = True  # write a checkpoint at each epoch end
    progress: str = "auto"  # auto (bar on a terminal, lines otherwise) | bar | lines | none
    benchmark_steps: int = 20  # run.mode=benchmark: timed train steps on random in-memory batches
    tensorboard: bool = True  # rank 0 writes TensorBoard scalars into the run directory (tensorboard --logdir outputs)
    allow_not_converged: bool = False  # a run that ends short of the target exits 0, not NOT_CONVERGED (3)


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    device: DeviceConfig = field(default_factory=DeviceConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    mlperf: MlperfConfig = field(default_factory=MlperfConfig)
    run: RunConfig = field(default_factory=RunConfig)


def register() -> None:
    """Make the schema the base of configs/config.yaml (its defaults list names `schema`)."""
    ConfigStore.instance().store(name="schema", node=Config)


def simulated(device: DeviceConfig) -> bool:
    """Whether the run's steps execute on a simulated IPU system (configs/device/ipu_*.yaml)."""
    return device.name == "ipu_sim"


@dataclass(frozen=True)
class BatchShape:
    """How one weight update's `global_batch` images are dealt: over the ranks, to the data-parallel replicas (one
    per rank natively; a simulated IPU system's replicas, spread over the ranks), each taking `grad_accum`
    micro-batches; BatchNorm sees the micro-batches of `bn_group` replicas together."""

    global_batch: int
    ranks: int
    replicas: int
    grad_accum: int
    bn_group: int

    @property
    def per_rank(self) -> int:
        return self.global_batch // self.ranks

    @property
    def micro_batch(self) -> int:
        return self.global_batch // (self.replicas * self.grad_accum)

    @property
    def bn_span(self) -> int:
        """The images one BatchNorm's statistics cover."""
        return self.micro_batch * self.bn_group


def batch_shape(cfg: Config, world_size: int) -> BatchShape:
    """The run's batch shape on `world_size` ranks."""
    replicas = cfg.device.replicas if simulated(cfg.device) else world_size
    return BatchShape(cfg.data.global_batch, world_size, replicas, cfg.dist.grad_accum, cfg.dist.bn_group_size)


def _no_added_keys(section: DataclassInstance, prefix: str = "") -> None:
    """Refuse a key that `+key=value` added to the schema: Hydra composes it, and OmegaConf.to_object keeps it as
    an attribute that nothing reads."""
    known = {item.name for item in fields(section)}
    for name, value in vars(section).items():
        if name not in known:
            raise UnknownKey(prefix + name)
        if is_dataclass(value) and not isinstance(value, type):
            _no_added_keys(value, f"{prefix}{name}.")


def _require(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(key, message)


def _one_of(value: str, key: str, allowed: tuple[str, ...]) -> None:
    _require(value in allowed, key, f"{value!r} is not one of {', '.join(allowed)}")


def _positive(value: float, key: str) -> None:
    _require(value > 0 and math.isfinite(value), key, f"must be a positive number, got {value}")


def _is_power_of_two_times(value: float, unit: float) -> bool:
    if value <= 0:
        return False
    exponent = math.log2(value / unit)
    return abs(exponent - round(exponent)) < 1e-9


def validate(cfg: Config, world_size: int = 1) -> None:
    """Check every value a user can set; raise ConfigError for the first one that is wrong."""
    _no_added_keys(cfg)
    _validate_model(cfg.model)
    shape = batch_shape(cfg, world_size)
    _validate_data(cfg.data, shape, reads_files=cfg.run.mode == "train")
    _validate_optim(cfg.optim, cfg.run.max_epochs)
    _validate_precision(cfg.precision)
    _one_of(cfg.device.name, "device.name", DEVICES)
    if simulated(cfg.device):
        _validate_ipu(cfg.device, cfg.dist, shape)
    _require(cfg.device.threads >= 0, "device.threads", f"must be 0 (default) or more, got {cfg.device.threads}")
    _validate_dist(cfg.dist, world_size, bn_groups_of_ranks=not simulated(cfg.device))
    _validate_mlperf(cfg.mlperf)
    _require(
        cfg.mlperf.clock == "wall" or simulated(cfg.device),
        "mlperf.clock",
        "device time is the simulated IPU's: it needs device=ipu_pod16, ipu_pod64, ...",
    )
    if cfg.mlperf.division == "closed":
        _validate_closed_division(cfg)
    _validate_run(cfg.run)
    _require(
        cfg.run.mode != "project" or simulated(cfg.device),
        "run.mode",
        "project times a simulated IPU system: add device=ipu_pod16, ipu_pod64, ...",
    )


def _validate_model(model: ModelConfig) -> None:
    _one_of(model.name, "model.name", ("resnet50",))
    _require(0 < model.bn_momentum < 1, "model.bn_momentum", f"must be in (0, 1), got {model.bn_momentum}")
    _positive(model.bn_eps, "model.bn_eps")


def _validate_data(data: DataConfig, shape: BatchShape, reads_files: bool = True) -> None:
    _one_of(data.name, "data.name", DATASETS)
    if data.name == "imagenet" and reads_files:
        _require(data.root is not None, "data.root", "ImageNet needs data.root=/path/to/imagenet")
        root = Path(str(data.root)).expanduser()
        _require(root.is_dir(), "data.root", f"directory {root} does not exist")
    _require(data.image_size >= 32, "data.image_size", f"must be at least 32 pixels, got {data.image_size}")
    _require(
        data.eval_resize >= data.image_size,
        "data.eval_resize",
        f"must be at least data.image_size ({data.image_size}), got {data.eval_resize}",
    )
    _require(0 < data.crop_area_min <= 1, "data.crop_area_min", f"must be in (0, 1], got {data.crop_area_min}")
    _positive(data.global_batch, "data.global_batch")
    batch_divisor = shape.ranks * shape.grad_accum
    _require(
        data.global_batch % batch_divisor == 0,
        "data.global_batch",
        f"{data.global_batch} is not divisible by world size x dist.grad_accum = {batch_divisor}",
    )
    _positive(data.eval_batch, "data.eval_batch")
    _require(
        data.workers is None or data.workers >= 0, "data.workers", f"must be 0 or more, or null, got {data.workers}"
    )
    _one_of(data.format, "data.format", FORMATS)
    _one_of(data.corrupt, "data.corrupt", CORRUPT_POLICIES)
    _one_of(data.decode, "data.decode", DECODERS)
    _positive(data.max_pixels, "data.max_pixels")
    syn = data.synthetic
    _require(
        2 <= syn.classes <= MAX_CLASSES,
        "data.synthetic.classes",
        f"must be in [2, {MAX_CLASSES}], got {syn.classes}",
    )
    _positive(syn.train_per_class, "data.synthetic.train_per_class")
    _positive(syn.val_per_class, "data.synthetic.val_per_class")


def _validate_optim(optim: OptimConfig, max_epochs: int) -> None:
    _one_of(optim.name, "optim.name", OPTIMIZERS)
    _positive(optim.base_lr, "optim.base_lr")
    _require(0 <= optim.momentum < 1, "optim.momentum", f"must be in [0, 1), got {optim.momentum}")
    _require(optim.weight_decay >= 0, "optim.weight_decay", f"must be 0 or more, got {optim.weight_decay}")
    _positive(optim.eta, "optim.eta")
    _require(
        0 <= optim.warmup_epochs < max_epochs,
        "optim.warmup_epochs",
        f"must be in [0, run.max_epochs={max_epochs}), got {optim.warmup_epochs}",
    )
    if optim.decay_epochs is not None:
        _positive(optim.decay_epochs, "optim.decay_epochs")
    _require(0 <= optim.end_lr < optim.base_lr, "optim.end_lr", f"must be in [0, base_lr), got {optim.end_lr}")
    _positive(optim.poly_power, "optim.poly_power")
    _require(
        0 <= optim.label_smoothing < 1,
        "optim.label_smoothing",
        f"must be in [0, 1), got {optim.label_smoothing}",
    )


def _validate_dist(d: DistConfig, world_size: int, bn_groups_of_ranks: bool = True) -> None:
    _require(d.grad_accum >= 1, "dist.grad_accum", f"must be 1 or more, got {d.grad_accum}")
    if bn_groups_of_ranks:
        _require(
            d.bn_group_size >= 1 and world_size % d.bn_group_size == 0,
            "dist.bn_group_size",
            f"must divide the world size ({world_size} ranks), got {d.bn_group_size}",
        )
    if d.bucket_mb is not None:
        _positive(d.bucket_mb, "dist.bucket_mb")
    _positive(d.timeout_s, "dist.timeout_s")


def _validate_ipu(device: DeviceConfig, dist: DistConfig, shape: BatchShape) -> None:
    """The simulated IPU run's layout must fit its system and add up to the global batch."""
    system = device.system
    if system is None:
        raise ConfigError("device", "ipu_sim needs a system: device=ipu_pod16, ipu_pod64, ...")
    _require(not device.compile, "device.compile", "a simulated IPU runs eager: compile is for device=cpu or cuda")
    _require(
        not device.cuda_graphs, "device.cuda_graphs", "a simulated IPU runs eager: CUDA graphs are for device=cuda"
    )
    _require(device.replicas >= 1, "device.replicas", f"must be 1 or more, got {device.replicas}")
    _require(
        device.replicas % shape.ranks == 0,
        "device.replicas",
        f"{device.replicas} replicas do not spread evenly over {shape.ranks} ranks",
    )
    micro, accum = shape.micro_batch, shape.grad_accum
    _require(
        micro >= 1 and micro * accum * device.replicas == shape.global_batch,
        "data.global_batch",
        f"{shape.global_batch} is not micro-batch {micro} x dist.grad_accum {accum} x {device.replicas} replicas",
    )
    stages = len(device.pipeline_splits) + 1
    _require(
        stages == 1 or accum >= stages,
        "dist.grad_accum",
        f"a pipeline of {stages} stages needs at least {stages} micro-batches per update, got {accum}",
    )
    _require(
        device.replicas * stages <= system.ipus,
        "device.replicas",
        f"{device.replicas} replicas x {stages} IPUs each need more than the {system.ipus} IPUs of {system.name}",
    )
    per_rank = device.replicas // shape.ranks
    _require(
        dist.bn_group_size >= 1 and per_rank % dist.bn_group_size == 0,
        "dist.bn_group_size",
        f"BatchNorm groups of {dist.bn_group_size} replicas must divide the {per_rank} replicas of a rank",
    )
    if device.device_iterations is not None:
        _positive(device.device_iterations, "device.device_iterations")
    _one_of(device.optimizer_state, "device.optimizer_state", OPTIMIZER_STATES)


def _validate_mlperf(mlperf: MlperfConfig) -> None:
    _one_of(mlperf.division, "mlperf.division", ("closed", "open"))
    _one_of(mlperf.status, "mlperf.status", ("cloud", "onprem", "preview", "research"))
    _require(bool(mlperf.org.strip()), "mlperf.org", "must not be empty")
    _require(bool(mlperf.platform.strip()), "mlperf.platform", "must not be empty")
    _require(
        0 < mlperf.target_accuracy <= 1,
        "mlperf.target_accuracy",
        f"is a fraction in (0, 1], got {mlperf.target_accuracy}",
    )
    _require(mlperf.eval_every >= 1, "mlperf.eval_every", f"must be 1 or more, got {mlperf.eval_every}")
    _require(
        1 <= mlperf.first_eval <= mlperf.eval_every,
        "mlperf.first_eval",
        f"must be in [1, mlperf.eval_every={mlperf.eval_every}], got {mlperf.first_eval}",
    )
    _one_of(mlperf.clock, "mlperf.clock", ("wall", "device"))


def _validate_closed_division(cfg: Config) -> None:
    """The MLPerf closed-division rules for ResNet that a configuration can break (ruleset 4.0.0)."""
    optim = cfg.optim
    _require(
        _is_power_of_two_times(optim.weight_decay, 1e-4),
        "optim.weight_decay",
        f"closed division allows 0.0001 * 2^N (e.g. 5e-05, 0.0001, 0.0002), got {optim.weight_decay}",
    )
    _require(
        math.isclose(optim.end_lr, 1e-4),
        "optim.end_lr",
        f"closed division requires 0.0001, got {optim.end_lr}",
    )
    _require(optim.poly_power == 2, "optim.poly_power", f"closed division requires 2, got {optim.poly_power}")
    _require(
        optim.label_smoothing in (0.0, 0.1),
        "optim.label_smoothing",
        f"closed division allows 0 or 0.1, got {optim.label_smoothing}",
    )
    if optim.name == "sgd":
        _require(
            math.isclose(optim.momentum, 0.9),
            "optim.momentum",
            f"closed division SGD requires 0.9, got {optim.momentum}",
        )
        _require(
            abs(optim.base_lr * 1000 - round(optim.base_lr * 1000)) < 1e-6,
            "optim.base_lr",
            f"closed division SGD requires a multiple of 0.001, got {optim.base_lr}",
        )
    if optim.name == "lars" and cfg.data.global_batch < 32768:
        _require(
            math.isclose(optim.momentum, 0.9),
            "optim.momentum",
            f"closed division LARS below batch 32k requires 0.9, got {optim.momentum}",
        )
    _require(
        cfg.mlperf.target_accuracy >= 0.759,
        "mlperf.target_accuracy",
        f"closed division requires at least 0.759, got {cfg.mlperf.target_accuracy}",
    )


def _validate_precision(precision: PrecisionConfig) -> None:
    _one_of(precision.compute, "precision.compute", tuple(DTYPES))
    _one_of(precision.master, "precision.master", ("fp32", precision.compute))
    _one_of(precision.loss_scaling, "precision.loss_scaling", LOSS_SCALING)
    _positive(precision.init_scale, "precision.init_scale")
    _positive(precision.growth_interval, "precision.growth_interval")
    _one_of(precision.emulate, "precision.emulate", EMULATE)
    _require(
        precision.emulate != "always" or precision.compute != "fp32",
        "precision.emulate",
        "fp16 and bf16 are emulated, and precision.compute is fp32",
    )


def _validate_run(run: RunConfig) -> None:
    _one_of(run.mode, "run.mode", ("train", "benchmark", "project"))
    _positive(run.benchmark_steps, "run.benchmark_steps")
    _require(run.max_epochs >= 1, "run.max_epochs", f"must be 1 or more, got {run.max_epochs}")
    _require(run.seed >= 0, "run.seed", f"must be 0 or more, got {run.seed}")
    _one_of(run.resume, "run.resume", ("none", "auto"))
    _one_of(run.progress, "run.progress", PROGRESS_MODES)


def training_fingerprint(cfg: Config, world_size: int) -> dict[str, object]:
    """The settings a checkpoint must share with the run that resumes it, as dotted keys, and the world size.

    Everything that changes the arithmetic of training is in; where it runs and how fast (device, loader
    workers, evaluation batch, progress display, data path) is out.
    """
    sections: dict[str, DataclassInstance] = {
        "model": cfg.model,
        "optim": cfg.optim,
        "precision": cfg.precision,
        "dist": cfg.dist,
    }
    flat: dict[str, object] = {
        f"{name}.{key}": value for name, section in sections.items() for key, value in asdict(section).items()
    }
    data = cfg.data
    flat |= {
        "data.name": data.name,
        "data.image_size": data.image_size,
        "data.eval_resize": data.eval_resize,
        "data.crop_area_min": data.crop_area_min,
        "data.global_batch": data.global_batch,
        "run.seed": cfg.run.seed,
        "run.max_epochs": cfg.run.max_epochs,
    }
    if data.name == "synthetic":
        flat |= {f"data.synthetic.{k}": v for k, v in asdict(data.synthetic).items()}
    return flat | {"world_size": world_size}
