"""The hardware families a run executes on or projects onto, by device.name (its section: configs/device/): the
backend whose steps run it, where it has one, and the projection run.mode=project prints for it, where it has one.
project.py and backends/build.py reach a family here; a new family adds its line to FAMILIES."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from backends.base import BackendSection, RunFacts
from backends.ipu_sim import simulator
from backends.ipu_sim.backend import IpuSimBackend
from backends.native import NativeBackend, build_native
from configs.device.cluster import ClusterConfig
from configs.schema import Config
from configs.shape import BatchShape
from projection.convergence import Epochs
from projection.gpu.cost import Layout
from projection.gpu.measured import read_check
from projection.gpu.report import projection_report
from projection.ipu import report
from projection.run import Schedule

Build = Callable[[Config, BackendSection, RunFacts, int], NativeBackend]
# run.mode=project's answer: from the run's config, batch shape and classes, its schedule for a number of epochs,
# and the epochs it trains (given, or where MLPerf's reference runs stop); its JSON line last
Project = Callable[[Config, BatchShape, int, Callable[[int], Schedule], Callable[[], Epochs]], str]


@dataclass(frozen=True)
class Family:
    """A kind of hardware a run executes on or projects onto; each takes the arguments its kind of answer takes,
    whether it reads them or not, so that project.py and backends/build.py call every family alike."""

    backend: type[NativeBackend] | None  # whose select_device places a rank's steps; None: projected onto only
    build: Build | None
    project: Project | None = None
    preview: Callable[[Config, BatchShape, int], str | None] | None = None  # what a run prints instead of running


def on_native_device(cfg: Config, section: BackendSection, facts: RunFacts, classes: int) -> NativeBackend:
    return build_native(section, facts, classes)


def on_ipu_system(
    cfg: Config, shape: BatchShape, classes: int, schedule_of: Callable[[int], Schedule], epochs: Callable[[], Epochs]
) -> str:
    """Probe the model on the host, then the system's memory plan, the step time by component, and the projected
    epoch and time to train for run.max_epochs (the mlperf_pod* recipes give the epochs Graphcore's runs took)."""
    plan = simulator.plan(cfg, shape, simulator.build_model(cfg, classes))
    system = simulator.section(cfg).chosen_system
    return report.project(plan, system, schedule_of(cfg.run.max_epochs), cfg.data.global_batch)


def on_gpu_cluster(
    cfg: Config, shape: BatchShape, classes: int, schedule_of: Callable[[int], Schedule], epochs: Callable[[], Epochs]
) -> str:
    """The cluster's step, epoch and time to train for the epochs given, with a step make gpu-check measured where
    device.measured names one."""
    device = cfg.device
    assert isinstance(device, ClusterConfig)  # the config's check
    layout = Layout(device.nodes, device.gpus_per_node, shape.micro_batch * shape.grad_accum)
    trained = epochs()
    check = None if device.measured is None else read_check(device.measured)
    return projection_report(device.chosen_cluster, layout, schedule_of(trained.count), trained, check)


NATIVE = Family(NativeBackend, on_native_device)
FAMILIES = {
    "cpu": NATIVE,
    "cuda": NATIVE,
    "ipu_sim": Family(IpuSimBackend, simulator.build_backend, on_ipu_system, simulator.listed_cuts),
    "gpu_cluster": Family(None, None, on_gpu_cluster),
}


def family_of(cfg: Config) -> Family:
    """The family of the run's device (the config's check has made sure the registry knows its name)."""
    return FAMILIES[cfg.device.name]
