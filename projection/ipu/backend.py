"""The simulated IPU system's training step: backends/replicas.py's virtual replicas, each a pipeline of IPUs where
the model is cut into stages.

What each replica computes is the IPU's: its micro-batches, BatchNorm over its micro-batch or over a group of
replicas' micro-batches, gradients accumulated over K micro-batches, then one averaged update. Under an emulated
fp16 policy with stochastic rounding, each replica rounds its activations with its own random stream, as each IPU
replica has its own seed.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import torch
from torch import nn

from backends.base import BackendSection, RunFacts, StepSettings
from backends.clock import DeviceClock
from backends.native import Pass, optimizer_for
from backends.replicas import ReplicaBackend
from projection.ipu.config import IpuSimConfig, pipeline_short_of_micro_batches
from projection.ipu.pipeline import Pipeline


class IpuSimBackend(ReplicaBackend):
    """The virtual replicas (ReplicaBackend) of an IPU system.

    With `pipeline_splits` (module names at whose first call a pipeline stage begins) each group's K passes run
    through the stages in Graphcore's grouped pipeline schedule, which computes the same numbers.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        device: torch.device,
        step: StepSettings,
        *,
        replicas: int,
        bn_group: int = 1,
        clock: DeviceClock | None = None,
        pipeline_splits: Sequence[str] = (),
        sharded: bool = False,
    ) -> None:
        super().__init__(model, optimizer, device, step, replicas=replicas, bn_group=bn_group, clock=clock)
        self.pipeline = Pipeline(self.model, pipeline_splits, sharded) if pipeline_splits else None
        stages = len(self.pipeline.stages) if self.pipeline else 1
        if why := pipeline_short_of_micro_batches(stages, self.grad_accum, sharded):
            raise ValueError(why)

    def run_passes(self, passes: list[Pass]) -> torch.Tensor:
        """Pipelined: each BatchNorm group's K passes through the pipeline in turn (they are its replicas' micro-
        batches), with `gradients.arm()` before the last group's last backward; returns the losses' sum."""
        if self.pipeline is None:
            return super().run_passes(passes)
        total = torch.zeros((), device=self.device)
        groups = [passes[i : i + self.grad_accum] for i in range(0, len(passes), self.grad_accum)]
        objective = partial(self.backward_loss, passes=len(passes))
        for i, group in enumerate(groups, 1):
            arm = self.gradients.arm if i == len(groups) else _nothing
            for loss in self.pipeline.run(group, self.precision.forward, objective, arm):
                total += loss
        return total


def _nothing() -> None:
    pass


def build_ipu_sim(
    section: BackendSection, facts: RunFacts, model: nn.Module, clock: DeviceClock, splits: Sequence[str]
) -> IpuSimBackend:
    """The native backend's parts on the host around the model the simulator built and cut at `splits`, with this
    rank's share of the replicas; the system's clock (timed once its memory plan fits) times the steps."""
    device = section.device
    assert isinstance(device, IpuSimConfig)  # the simulator builds it for a simulated system's section
    return IpuSimBackend(
        model,
        optimizer_for(section, model),
        facts.device,
        section.step,
        replicas=device.replicas // facts.topology.world_size,
        bn_group=section.bn_group_size,
        clock=clock,
        pipeline_splits=splits,
        sharded=device.pipeline_mode == "sharded",
    )
