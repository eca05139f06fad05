"""A run's layout on the simulated IPU system and what the probe makes of it: the per-IPU memory plan, and the run
shape the cost model times. Training (the memory check at build), run.mode=project and the calibration all start
here, so they judge the same figures."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from data.datasets import IMAGENET_TRAIN_IMAGES
from projection.ipu.config import Chip
from projection.ipu.cost import RunShape, updates_per_host_call
from projection.ipu.memory import MemoryPlan, plan_memory
from projection.probe import profile_model
from projection.profile import ModelProfile

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
OPTIMIZER_SLOTS = 1  # momentum, for LARS and SGD alike


@dataclass(frozen=True)
class Layout:
    """How one run lays the model out: device.*, dist.* and precision.* as the simulator reads them."""

    replicas: int
    micro_batch: int
    grad_accum: int
    image_size: int
    splits: tuple[str, ...] = ()
    recompute: str = "none"  # none | auto | module names, comma-separated
    device_iterations: int | None = None  # None: Graphcore's, one host round trip per log interval
    optimizer_state: str = "on_chip"
    input_8bit: bool = True
    compute: str = "fp16"
    master: str = "fp16"
    merged_allreduce: bool = True
    sharded: bool = False  # the stages take turns instead of pipelining

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.grad_accum * self.replicas

    def checkpoints(self) -> str | list[str]:
        """`recompute` as the probe takes it."""
        if self.recompute in ("none", "auto"):
            return self.recompute
        return [name.strip() for name in self.recompute.split(",") if name.strip()]

    def shape(self, train_images: int = IMAGENET_TRAIN_IMAGES) -> RunShape:
        """The run shape the cost model times; an epoch of `train_images` sets Graphcore's host round trips."""
        return RunShape(
            replicas=self.replicas,
            micro_batch=self.micro_batch,
            grad_accum=self.grad_accum,
            device_iterations=self.device_iterations or updates_per_host_call(train_images, self.global_batch),
            fp16=self.compute != "fp32",
            fp32_master=self.master == "fp32",
            merged_allreduce=self.merged_allreduce,
            optimizer_in_streaming=self.optimizer_state == "streaming",
            sharded=self.sharded,
        )


@dataclass(frozen=True)
class Plan:
    layout: Layout
    profile: ModelProfile
    memory: MemoryPlan


def plan_run(model: nn.Module, layout: Layout, chip: Chip) -> Plan:
    """Probe one micro-batch of `model` as `layout` splits and recomputes it, and plan each IPU's memory.
    Raises ValueError for a split or checkpoint name the model does not run."""
    profile = profile_model(
        model,
        micro_batch=layout.micro_batch,
        image_size=layout.image_size,
        splits=layout.splits,
        recompute=layout.checkpoints(),
        activation_dtype_bytes=DTYPE_BYTES[layout.compute],
        input_bytes_per_pixel=1 if layout.input_8bit else DTYPE_BYTES[layout.compute],
    )
    return Plan(layout, profile, memory_plan(profile, layout, chip))


def memory_plan(profile: ModelProfile, layout: Layout, chip: Chip) -> MemoryPlan:
    """Each IPU's memory for `profile`'s stages as `layout` keeps weights, optimizer state and micro-batches."""
    return plan_memory(
        profile,
        chip,
        master_bytes=DTYPE_BYTES[layout.master],
        optimizer_slots=OPTIMIZER_SLOTS,
        optimizer_state=layout.optimizer_state,
        grad_accum=layout.grad_accum,
        sharded=layout.sharded,
    )
