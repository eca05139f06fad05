"""The hardware families a run executes on or projects onto. configs/device/sections.py maps each device.name to its
family's section, and the section names its family (`DeviceConfig.family`): what builds the backend whose steps run
it, where it has one, and the projection run.mode=project prints for it, where it has one. starting.py, benchmark.py
and project.py reach a family here, so that a new family is one folder beside ipu/ and gpu/ and one registry line.
`answer` is a run's projection, as run.mode=project prints it and the planner (projection/plan.py) reads it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

from hydra.utils import get_object

from backends.base import Backend, BackendSection, RunFacts
from backends.build import section_of
from backends.native import NativeBackend, build_native
from configs.schema import Config
from configs.shape import BatchShape
from data.datasets import dataset_size
from projection.convergence import Epochs, given_epochs, reference_epochs
from projection.run import Schedule

Build = Callable[[Config, BackendSection, RunFacts, int], NativeBackend]
# run.mode=project's answer: from the run's config, batch shape and classes, its schedule for a number of epochs,
# and the epochs it trains (given, or where MLPerf's reference runs stop); its JSON line last
Project = Callable[[Config, BatchShape, int, Callable[[int], Schedule], Callable[[], Epochs]], str]


@dataclass(frozen=True)
class Family:
    """A kind of hardware a run executes on or projects onto; each takes the arguments its kind of answer takes,
    whether it reads them or not, so that starting.py and project.py call every family alike."""

    build: Build | None  # the backend whose steps run the device; None: projected onto only
    project: Project | None = None
    preview: Callable[[Config, BatchShape, int], str | None] | None = None  # what a run prints instead of running


def on_native_device(cfg: Config, section: BackendSection, facts: RunFacts, classes: int) -> NativeBackend:
    return build_native(section, facts, classes)


NATIVE = Family(on_native_device)  # the host's CPU or GPU (device=cpu, device=cuda)


def family_of(cfg: Config) -> Family:
    """The family the run's device section names, by its dotted path as a Hydra `_target_` names a class: the
    section is a config module, which may not import its family's code (that code reads the whole config)."""
    family = get_object(type(cfg.device).family)
    assert isinstance(family, Family), f"{type(cfg.device).family} is no Family"
    return family


def build_backend(cfg: Config, facts: RunFacts, classes: int) -> Backend:
    """The backend of cfg.device.name for a model of `classes` classes, on this rank's device."""
    build = family_of(cfg).build
    assert build is not None, f"device={cfg.device.name} is projected onto only (the config's check)"
    return build(cfg, section_of(cfg, facts), facts, classes)


def answer(cfg: Config, shape: BatchShape, command_line: Sequence[str]) -> str:
    """The device's family's projection of the run (its report, the JSON line last)."""
    projected = family_of(cfg).project
    assert projected is not None, f"device={cfg.device.name} is not projected onto (the config's check)"
    classes, _, _ = dataset_size(cfg.data)
    return projected(cfg, shape, classes, partial(schedule_of, cfg), partial(epochs_of, cfg, command_line))


def schedule_of(cfg: Config, epochs: int) -> Schedule:
    _, train_images, eval_images = dataset_size(cfg.data)
    return Schedule(epochs, train_images, eval_images, cfg.mlperf.eval_every, cfg.mlperf.first_eval)


def epochs_of(cfg: Config, command_line: Sequence[str]) -> Epochs:
    """run.max_epochs where the command line gives it, with where runs would stop around it; else where MLPerf's
    reference runs for the global batch stop."""
    schedule = schedule_of(cfg, cfg.run.max_epochs)
    if any(override.startswith("run.max_epochs=") for override in command_line):
        return given_epochs(cfg.run.max_epochs, cfg.data.global_batch, schedule)
    return reference_epochs(cfg.data.global_batch, schedule)
