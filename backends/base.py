"""What the training loop drives: a step that updates weights and a step that evaluates, wherever they run."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch

from configs.device.native import NativeConfig
from configs.shape import BatchShape
from distributed.topology import Topology
from monitor.progress import SimulatedClock
from optim.config import OptimConfig
from optim.precision import Policy

if TYPE_CHECKING:
    from configs.schema import ModelConfig


@dataclass(frozen=True)
class RunFacts:
    """What a run works out once, at the top (backends.build.run_facts), and hands down: this rank of the launch,
    the torch device its steps run on, the precision policy as that device runs it, and how the global batch is
    dealt. Nothing below train.py derives them again."""

    topology: Topology
    device: torch.device
    policy: Policy
    shape: BatchShape


@dataclass(frozen=True)
class StepSettings:
    """How a backend's train step runs: what a backend built directly (as tests and benches build one) is given
    besides its model, optimizer and device."""

    label_smoothing: float
    policy: Policy = field(default_factory=Policy)  # as the device runs it (RunFacts.policy)
    grad_accum: int = 1  # micro-batches per update, on each rank (or each simulated replica)
    seed: int = 0  # the weight update's stochastic-rounding stream
    bucket_mb: float | None = None  # the gradient all-reduce's buckets; None: one
    overlap: bool = False  # each bucket reduced during backward, as soon as it is full
    batchnorm_16bit: bool = False  # BatchNorm takes native 16-bit activations as they are
    compiled: bool = False  # the model through torch.compile
    cuda_graphs: bool = False  # the step captured in a CUDA graph where it can be (backends/graphs.py)


@dataclass(frozen=True)
class BackendSection:
    """What a backend reads of the run's configuration, gathered in one place (backends.build.section_of): how its
    model and optimizer are built, and how its step runs."""

    model: ModelConfig
    optim: OptimConfig
    device: NativeConfig
    bn_group_size: int  # ranks (or simulated replicas) whose BatchNorm statistics are reduced together
    step: StepSettings


class Backend(Protocol):
    """A model, its optimizer and numerics, bound to where they execute.

    Steps take uint8 NHWC images and int64 labels on the host and return device tensors, so the loop
    decides when to synchronise (reading a loss is a host sync).
    """

    device: torch.device

    @property
    def policy(self) -> Policy:
        """The precision policy its steps follow."""
        ...

    @property
    def loss_scale(self) -> float:
        """The loss scale now (1 without loss scaling)."""
        ...

    @property
    def skipped_steps(self) -> int:
        """Updates skipped so far because loss scaling found non-finite gradients."""
        ...

    @property
    def allreduce_s(self) -> float:
        """Seconds this rank has waited so far for the gradient all-reduce (0 with one rank)."""
        ...

    def train_step(self, images: torch.Tensor, labels: torch.Tensor, lr: float) -> torch.Tensor:
        """One weight update at learning rate `lr`; returns the mean training loss."""
        ...

    @property
    def steps_per_call(self) -> int | None:
        """The steps the host hands the device in one call (None: the whole epoch), which the device takes without
        it: the loop shows progress, stops and checkpoints between calls, and at an epoch's end, which ends a call.
        1 where the steps run here."""
        ...

    def end_call(self) -> None:
        """The call under way ends after this step: the loop says so at each call's end, which at an epoch's last
        step may come before steps_per_call is up."""
        ...

    def end_epoch(self) -> None:
        """Called on every rank after each training epoch: the ranks' copies of the model become identical
        (e.g. BatchNorm running statistics averaged), ready for evaluation and checkpoints."""
        ...

    def eval_step(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Returns the number of top-1 correct predictions in the batch."""
        ...

    def compile_ahead(self, train_batch: int, eval_batches: Sequence[int], image_size: int, classes: int) -> None:
        """Run the steps once on synthetic batches of these shapes (each evaluation batch size the run will meet:
        the full one and a last, partial one), leaving every state as it was: whatever the first steps compile is
        compiled before the clock starts."""
        ...

    def now(self) -> float:
        """Seconds since the epoch where the steps run: the wall clock, or a simulated device's clock."""
        ...

    @property
    def simulated_clock(self) -> SimulatedClock | None:
        """The simulated system's clock that times the steps (now() reads it); None where they run here."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def state_to_come(self) -> int:
        """The bytes `state_dict` grows by at the first step (an optimizer's momentum buffers, made then): a
        checkpoint's size is known before the run starts."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def rank_state_dict(self) -> dict[str, Any]:
        """What only this rank holds in the middle of an epoch (e.g. its BatchNorm running statistics, which
        `end_epoch` averages): a checkpoint keeps every rank's, so a run stopped mid-epoch resumes exactly."""
        ...

    def load_rank_state_dict(self, state: dict[str, Any]) -> None: ...
