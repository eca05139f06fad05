"""The device section every family's section extends: the name that picks where a run's steps execute, and the
questions the config's checks, the run's start and the MLPerf package ask of a device, answered here for a device
that runs the steps itself (the host's CPU or GPU). Each family's section (configs/device/sections.py lists them)
adds its own keys and answers for its kind of device, and names its family's code."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from configs.shape import BatchShape
from optim.config import PrecisionConfig


@dataclass
class DeviceConfig:
    name: str = "cpu"  # picks the section (configs/device/sections.py), and with it the family

    schema: ClassVar[str] = ""  # the section's name in Hydra's config store, which a device option's defaults name
    needs: ClassVar[str] = ""  # what a device option of this section gives, as a refusal names it
    simulated: ClassVar[bool] = False  # a simulated clock times its steps (mlperf.clock=device may log it)
    projected: ClassVar[bool] = False  # run.mode=project times a run on it
    dealt_to: ClassVar[str] = "ranks"  # what the global batch is dealt to, as its check names them
    family: ClassVar[str] = "projection.families.NATIVE"  # the family's code (projection/families.py's Family), by
    # its dotted path: a config module may not import it

    def validate(self, bn_group_size: int, shape: BatchShape) -> None:
        """Check the section's own keys; raise ConfigError for the first one that is wrong."""

    def replica_count(self, world_size: int) -> int:
        """Data-parallel replicas: one per rank where the steps run here."""
        return world_size

    def bn_group_of(self, dist_bn_group: int) -> int:
        """The replicas whose BatchNorm statistics are reduced together: dist.bn_group_size's, or the section's own."""
        return dist_bn_group

    def computes(self, precision: PrecisionConfig) -> PrecisionConfig:
        """The precision the device computes a run of `precision` in (a ConfigError where it cannot): as given."""
        return precision

    def only_projected(self) -> str | None:
        """Why a run cannot train on the device (it describes hardware to project onto); None where it can."""
        return None

    def device_time_platform(self) -> str | None:
        """The platform an MLPerf log in the device's simulated time names; None where it has no such clock."""
        return None

    def accelerator_fields(self) -> dict[str, str] | None:
        """The accelerator fields of an MLPerf system description; None where the machine that ran says them."""
        return None

    def imagenet_experiments(self) -> list[str]:
        """The recipes that project ImageNet on the device, best first (configs/experiment/<name>.yaml)."""
        return []
