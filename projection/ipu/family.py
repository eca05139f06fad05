"""The simulated IPU system as a family: the simulator builds its backend, and its models project a run onto it."""

from __future__ import annotations

from collections.abc import Callable

from configs.schema import Config
from configs.shape import BatchShape
from projection.convergence import Epochs
from projection.families import Family
from projection.ipu import report, simulator
from projection.run import Schedule


def project(
    cfg: Config, shape: BatchShape, classes: int, schedule_of: Callable[[int], Schedule], epochs: Callable[[], Epochs]
) -> str:
    """Probe the model on the host, then the system's memory plan, the step time by component, and the projected
    epoch and time to train for run.max_epochs (the mlperf_pod* recipes give the epochs Graphcore's runs took)."""
    plan = simulator.plan(cfg, shape, simulator.build_model(cfg, classes))
    system = simulator.section(cfg).chosen_system
    return report.text(plan, system, schedule_of(cfg.run.max_epochs), cfg.data.global_batch)


FAMILY = Family(simulator.build_backend, project, simulator.listed_cuts)
