"""The MLPerf section of a run's configuration (what its log says and when it evaluates) and the closed division's
rules for ResNet that a configuration can break. configs/schema.py composes them; this module imports no
implementation."""

from __future__ import annotations

import math
from dataclasses import dataclass

from configs.checks import one_of, require
from optim.config import OptimConfig
from rundir import MLPERF_LOG


@dataclass
class MlperfConfig:
    division: str = "closed"  # closed | open
    status: str = "onprem"  # cloud | onprem | preview | research
    org: str = "rn50perf"
    platform: str = "${device.name}-${oc.env:HOSTNAME,host}"  # e.g. cpu-myhost
    target_accuracy: float = 0.759
    eval_every: int = 4  # epochs between evaluations
    first_eval: int = 4  # epoch of the first evaluation, 1 to eval_every
    log_file: str = MLPERF_LOG
    clock: str = "wall"  # wall | device: ipu_sim's simulated device time (submission_platform then says so)

    def eval_epochs(self, max_epochs: int) -> set[int]:
        """The MLPerf schedule: every `eval_every` epochs starting at `first_eval`, and the last epoch of the
        budget."""
        return set(range(self.first_eval, max_epochs + 1, self.eval_every)) | {max_epochs}


def validate_mlperf(mlperf: MlperfConfig) -> None:
    one_of(mlperf.division, "mlperf.division", ("closed", "open"))
    one_of(mlperf.status, "mlperf.status", ("cloud", "onprem", "preview", "research"))
    require(bool(mlperf.org.strip()), "mlperf.org", "must not be empty")
    require(bool(mlperf.platform.strip()), "mlperf.platform", "must not be empty")
    require(
        0 < mlperf.target_accuracy <= 1,
        "mlperf.target_accuracy",
        f"is a fraction in (0, 1], got {mlperf.target_accuracy}",
    )
    require(mlperf.eval_every >= 1, "mlperf.eval_every", f"must be 1 or more, got {mlperf.eval_every}")
    require(
        1 <= mlperf.first_eval <= mlperf.eval_every,
        "mlperf.first_eval",
        f"must be in [1, mlperf.eval_every={mlperf.eval_every}], got {mlperf.first_eval}",
    )
    one_of(mlperf.clock, "mlperf.clock", ("wall", "device"))


def is_power_of_two_times(value: float, unit: float) -> bool:
    if value <= 0:
        return False
    exponent = math.log2(value / unit)
    return abs(exponent - round(exponent)) < 1e-9


def validate_closed_division(optim: OptimConfig, global_batch: int, target_accuracy: float) -> None:
    """The MLPerf closed-division rules for ResNet that a configuration can break (ruleset 4.0.0)."""
    require(
        is_power_of_two_times(optim.weight_decay, 1e-4),
        "optim.weight_decay",
        f"closed division allows 0.0001 * 2^N (e.g. 5e-05, 0.0001, 0.0002), got {optim.weight_decay}",
    )
    require(
        math.isclose(optim.end_lr, 1e-4),
        "optim.end_lr",
        f"closed division requires 0.0001, got {optim.end_lr}",
    )
    require(optim.poly_power == 2, "optim.poly_power", f"closed division requires 2, got {optim.poly_power}")
    require(
        optim.label_smoothing in (0.0, 0.1),
        "optim.label_smoothing",
        f"closed division allows 0 or 0.1, got {optim.label_smoothing}",
    )
    if optim.name == "sgd":
        require(
            math.isclose(optim.momentum, 0.9),
            "optim.momentum",
            f"closed division SGD requires 0.9, got {optim.momentum}",
        )
        require(
            abs(optim.base_lr * 1000 - round(optim.base_lr * 1000)) < 1e-6,
            "optim.base_lr",
            f"closed division SGD requires a multiple of 0.001, got {optim.base_lr}",
        )
    if optim.name == "lars" and global_batch < 32768:
        require(
            math.isclose(optim.momentum, 0.9),
            "optim.momentum",
            f"closed division LARS below batch 32k requires 0.9, got {optim.momentum}",
        )
    require(
        target_accuracy >= 0.759,
        "mlperf.target_accuracy",
        f"closed division requires at least 0.759, got {target_accuracy}",
    )
