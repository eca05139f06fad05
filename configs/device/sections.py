"""The registry of hardware families: each family's device section, by the device.name its options give. The
config's checks, the MLPerf package and, through the section's `family`, the run's start and run.mode=project reach
a family here; a new family adds its line. The sections are their families' config modules (projection/<family>/
config.py), which any room may import."""

from __future__ import annotations

from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from configs.checks import ConfigError, one_of
from configs.device.base import DeviceConfig
from configs.device.native import NativeConfig
from projection.gpu.config import ClusterConfig
from projection.ipu.config import IpuSimConfig
from projection.tpu.config import TpuSliceConfig

SECTIONS: dict[str, type[DeviceConfig]] = {
    "cpu": NativeConfig,
    "cuda": NativeConfig,
    "ipu_sim": IpuSimConfig,  # a simulated IPU system
    "gpu_cluster": ClusterConfig,  # GPU nodes that run.mode=project projects a run onto
    "tpu_slice": TpuSliceConfig,  # a TPU slice, simulated and projected
}
GROUP = "device_section"  # the config store's group of sections, which each device option's defaults name


def store(config_store: ConfigStore) -> None:
    """Each section in Hydra's config store, for a device option to compose onto (`- /device_section@_here_: ...`)."""
    for section in dict.fromkeys(SECTIONS.values()):
        config_store.store(group=GROUP, name=section.schema, node=section)


def check_section(device: DeviceConfig) -> None:
    """device.name must be one the registry knows, and name the section the device option composed."""
    one_of(device.name, "device.name", tuple(SECTIONS))
    section = SECTIONS[device.name]
    if type(device) is not section:
        raise ConfigError("device", f"{device.name} needs {section.needs}")


def from_resolved(device: dict[str, Any]) -> DeviceConfig:
    """A run's device section from its resolved config (.hydra/config.yaml), typed as the run composed it."""
    section = SECTIONS.get(str(device.get("name")), NativeConfig)
    typed = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(section), device))
    assert isinstance(typed, DeviceConfig)
    return typed
