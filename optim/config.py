"""The optimizer and precision sections of a run's configuration: their keys, defaults and checks.
configs/schema.py composes them; optim's implementation takes its choices from here, and this module imports
none of it."""

from __future__ import annotations

from dataclasses import dataclass

from configs.checks import one_of, positive, require
from configs.fingerprint import training

OPTIMIZERS = ("lars", "sgd")
COMPUTE_DTYPES = ("fp32", "bf16", "fp16")  # names of optim.precision.DTYPES
LOSS_SCALING = ("none", "static", "dynamic")
EMULATE = ("auto", "always", "never")


@dataclass
class OptimConfig:
    name: str = training("lars")  # lars | sgd
    base_lr: float = training(4.0)  # LARS at the embedded run's batch of 64
    momentum: float = training(0.9)
    weight_decay: float = training(5e-5)
    eta: float = training(0.001)  # LARS trust coefficient
    warmup_epochs: float = training(2.0)
    decay_epochs: float | None = training(None)  # None: from the end of warm-up to run.max_epochs
    end_lr: float = training(1e-4)
    poly_power: float = training(2.0)
    label_smoothing: float = training(0.1)


@dataclass
class PrecisionConfig:
    """The precision config group (configs/precision/<name>.yaml), as the schema composes it."""

    name: str = training("fp32")  # the policy's name in logs and tables
    compute: str = training("fp32")  # activations and compute copies of the weights: one of COMPUTE_DTYPES
    master: str = training("fp32")  # the weights the optimizer updates: fp32, or the compute dtype (16-bit masters)
    stochastic_rounding: bool = training(True)  # how 16-bit masters are rounded after an update (false: to nearest)
    loss_scaling: str = training("none")  # one of LOSS_SCALING
    init_scale: float = training(2.0**15)
    growth_interval: int = training(2000)  # dynamic: good updates before the scale doubles
    # 16-bit compute in fp32 arithmetic rounded per layer: auto (fp16 on the CPU, bf16 on a CPU without native
    # bf16) | always | never
    emulate: str = training("auto")


def validate_optim(optim: OptimConfig, max_epochs: int) -> None:
    one_of(optim.name, "optim.name", OPTIMIZERS)
    positive(optim.base_lr, "optim.base_lr")
    require(0 <= optim.momentum < 1, "optim.momentum", f"must be in [0, 1), got {optim.momentum}")
    require(optim.weight_decay >= 0, "optim.weight_decay", f"must be 0 or more, got {optim.weight_decay}")
    positive(optim.eta, "optim.eta")
    require(
        0 <= optim.warmup_epochs < max_epochs,
        "optim.warmup_epochs",
        f"must be in [0, run.max_epochs={max_epochs}), got {optim.warmup_epochs}",
    )
    if optim.decay_epochs is not None:
        positive(optim.decay_epochs, "optim.decay_epochs")
    require(0 <= optim.end_lr < optim.base_lr, "optim.end_lr", f"must be in [0, base_lr), got {optim.end_lr}")
    positive(optim.poly_power, "optim.poly_power")
    require(
        0 <= optim.label_smoothing < 1,
        "optim.label_smoothing",
        f"must be in [0, 1), got {optim.label_smoothing}",
    )


def validate_precision(precision: PrecisionConfig) -> None:
    one_of(precision.compute, "precision.compute", COMPUTE_DTYPES)
    one_of(precision.master, "precision.master", ("fp32", precision.compute))
    one_of(precision.loss_scaling, "precision.loss_scaling", LOSS_SCALING)
    positive(precision.init_scale, "precision.init_scale")
    positive(precision.growth_interval, "precision.growth_interval")
    one_of(precision.emulate, "precision.emulate", EMULATE)
    require(
        precision.emulate != "always" or precision.compute != "fp32",
        "precision.emulate",
        "fp16 and bf16 are emulated, and precision.compute is fp32",
    )
