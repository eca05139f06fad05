"""Where a training step executes. train.py drives a Backend without knowing which one: the device name picks its
class here, and the class builds itself from the config (`from_config`)."""

from __future__ import annotations

import torch

from backends.base import Backend
from backends.ipu_sim.backend import IpuSimBackend
from backends.native import NativeBackend
from configs.schema import Config, DeviceConfig
from distributed import Topology

BACKENDS: dict[str, type[NativeBackend]] = {"cpu": NativeBackend, "cuda": NativeBackend, "ipu_sim": IpuSimBackend}


def from_config(cfg: Config, classes: int, topology: Topology) -> Backend:
    """The backend of cfg.device.name for a model of `classes` classes, on this rank of `topology`."""
    return BACKENDS[cfg.device.name].from_config(cfg, classes, topology)


def select_device(cfg: DeviceConfig, local_rank: int) -> torch.device:
    """The torch device that device `cfg.name`'s steps run on, for the rank of `local_rank` on its machine."""
    return BACKENDS[cfg.name].select_device(cfg, local_rank)


__all__ = ["BACKENDS", "Backend", "IpuSimBackend", "NativeBackend", "from_config", "select_device"]
