"""A simulated TPU slice's training step: backends/replicas.py's virtual replicas, one per TensorCore, or per chip
where its two TensorCores run as one megacore, with BatchNorm summed over `device.bn_group` replicas."""

from __future__ import annotations

from typing import ClassVar

from torch import nn

from backends.base import BackendSection, RunFacts
from backends.clock import DeviceClock
from backends.native import optimizer_for
from backends.replicas import ReplicaBackend
from projection.tpu.config import TpuSliceConfig


class TpuSimBackend(ReplicaBackend):
    """The virtual replicas (ReplicaBackend) of a TPU slice, host calls of `steps_per_call` steps on its clock.

    A TPU's MXUs round their bf16 results to nearest: no replica rounds its activations stochastically (a bf16.16
    policy's stochastic rounding is its weight update's)."""

    rounds_activations_stochastically: ClassVar[bool] = False


def build_tpu_sim(section: BackendSection, facts: RunFacts, model: nn.Module, clock: DeviceClock) -> TpuSimBackend:
    """The native backend's parts on the host around the model the simulator built, with this rank's share of the
    slice's replicas; the slice's clock (timed once its memory plan fits) times the steps and host calls."""
    device = section.device
    assert isinstance(device, TpuSliceConfig)  # the simulator builds it for a TPU slice's section
    return TpuSimBackend(
        model,
        optimizer_for(section, model),
        facts.device,
        section.step,
        replicas=device.replicas // facts.topology.world_size,
        bn_group=device.bn_group,
        clock=clock,
    )
