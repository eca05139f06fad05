"""The backend of a run: the device name picks its class, and the class builds itself from the config and the
run's facts, which are worked out here once."""

from __future__ import annotations

import torch

from backends.base import Backend, RunFacts
from backends.ipu_sim.backend import IpuSimBackend
from backends.native import NativeBackend
from configs.schema import Config, batch_shape
from distributed import Topology
from optim.precision import Policy

BACKENDS: dict[str, type[NativeBackend]] = {"cpu": NativeBackend, "cuda": NativeBackend, "ipu_sim": IpuSimBackend}


def run_facts(cfg: Config, topology: Topology) -> RunFacts:
    """This rank's device (the CPU, or the GPU of its local rank; a ConfigError where there is none), the precision
    policy as that device runs it, and the batch shape over the launch's ranks."""
    return facts_on(cfg, topology, BACKENDS[cfg.device.name].select_device(cfg.device, topology.local_rank))


def facts_on(cfg: Config, topology: Topology, device: torch.device) -> RunFacts:
    """The run's facts with its steps on `device` (run_facts picks it; a test may name a GPU that is not there)."""
    return RunFacts(
        topology, device, Policy.for_device(cfg.precision, device.type), batch_shape(cfg, topology.world_size)
    )


def from_config(cfg: Config, facts: RunFacts, classes: int) -> Backend:
    """The backend of cfg.device.name for a model of `classes` classes, on this rank's device."""
    return BACKENDS[cfg.device.name].from_config(cfg, facts, classes)
