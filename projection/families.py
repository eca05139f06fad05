"""The hardware families a run executes on or projects onto. configs/device/sections.py maps each device.name to its
family's section, and the section names its family (`DeviceConfig.family`): what builds the backend whose steps run
it, where it has one, and the projection run.mode=project prints for it, where it has one. starting.py, benchmark.py
and project.py reach a family here, so that a new family is one folder beside ipu/ and gpu/ and one registry line."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hydra.utils import get_object

from backends.base import Backend, BackendSection, RunFacts
from backends.build import section_of
from backends.native import NativeBackend, build_native
from configs.schema import Config
from configs.shape import BatchShape
from projection.convergence import Epochs
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
