"""The backend of a run: the device name picks its class, and the class builds itself from the config."""

from __future__ import annotations

import torch

from backends.base import Backend
from backends.config import DeviceConfig
from backends.ipu_sim.backend import IpuSimBackend
from backends.native import NativeBackend
from configs.schema import Config
from distributed import Topology

BACKENDS: dict[str, type[NativeBackend]] = {"cpu": NativeBackend, "cuda": NativeBackend, "ipu_sim": IpuSimBackend}


def from_config(cfg: Config, classes: int, topology: Topology) -> Backend:
    """The backend of cfg.device.name for a model of `classes` classes, on this rank of `topology`."""
    return BACKENDS[cfg.device.name].from_config(cfg, classes, topology)


def select_device(cfg: DeviceConfig, local_rank: int) -> torch.device:
    """The torch device that device `cfg.name`'s steps run on, for the rank of `local_rank` on its machine."""
    return BACKENDS[cfg.name].select_device(cfg, local_rank)
