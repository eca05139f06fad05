"""TPU slices as a family: the simulator builds the backend a run trains on, and the cost model projects a run."""

from __future__ import annotations

from collections.abc import Callable

from configs.schema import Config
from configs.shape import BatchShape
from projection.convergence import Epochs
from projection.families import Family
from projection.run import Schedule
from projection.tpu import cost, report, simulator
from projection.tpu.config import TpuSliceConfig


def project(
    cfg: Config, shape: BatchShape, classes: int, schedule_of: Callable[[int], Schedule], epochs: Callable[[], Epochs]
) -> str:
    """The slice's step, epoch and time to train for the epochs given, or where MLPerf's reference runs stop."""
    device = cfg.device
    assert isinstance(device, TpuSliceConfig)  # the config's check
    chip = device.chosen_chip
    layout = cost.layout_of(device, shape.global_batch, chip.name in report.calibrated_chips())
    trained = epochs()
    return report.text(chip, layout, schedule_of(trained.count), trained)


FAMILY = Family(simulator.build_backend, project)
