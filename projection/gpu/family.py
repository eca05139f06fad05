"""GPU clusters as a family: projected onto only, from their figures or from a step make gpu-check measured."""

from __future__ import annotations

from collections.abc import Callable

from configs.schema import Config
from configs.shape import BatchShape
from projection.convergence import Epochs
from projection.families import Family
from projection.gpu import report
from projection.gpu.config import ClusterConfig
from projection.gpu.cost import Layout
from projection.gpu.measured import read_check
from projection.run import Schedule


def project(
    cfg: Config, shape: BatchShape, classes: int, schedule_of: Callable[[int], Schedule], epochs: Callable[[], Epochs]
) -> str:
    """The cluster's step, epoch and time to train for the epochs given, with a step make gpu-check measured where
    device.measured names one."""
    device = cfg.device
    assert isinstance(device, ClusterConfig)  # the config's check
    layout = Layout(device.nodes, device.gpus_per_node, shape.micro_batch * shape.grad_accum)
    trained = epochs()
    check = None if device.measured is None else read_check(device.measured)
    return report.text(device.chosen_cluster, layout, schedule_of(trained.count), trained, check)


FAMILY = Family(None, project)
