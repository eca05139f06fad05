"""The native backend: PyTorch eager on the CPU or a CUDA device."""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from backends.base import BackendSection, RunFacts, StepSettings
from backends.graphs import CudaGraphs
from configs.checks import ConfigError
from configs.device.native import NativeConfig
from distributed.allreduce import GradientBuckets, Stopwatch
from distributed.batchnorm import DistributedBatchNorm2d
from distributed.group import average_over_ranks, broadcast_from_main
from models import batchnorm, build_resnet50, random_batch
from models.loss import smoothed_cross_entropy
from models.resnet import NormLayer
from monitor.progress import SimulatedClock
from optim.optimizers import build_optimizer
from optim.precision import MixedPrecision, Policy

# images, labels, and the scope its forward runs in (reusable: a pipeline enters it once per stage)
Pass = tuple[torch.Tensor, torch.Tensor, AbstractContextManager[object]]


class LocalGradients:
    """One process: gradients are autograd's own tensors, freed between updates, with nothing to reduce."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        self.waited = Stopwatch(torch.device("cpu"))  # nothing to wait for

    def zero_(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def arm(self) -> None:
        pass

    def reduce(self) -> None:
        pass


class NativeBackend:
    """Forward under the precision policy, label-smoothed loss in fp32, backward over `grad_accum`
    micro-batches, the gradients averaged over the ranks in bulk, then one optimizer step unless loss
    scaling found non-finite gradients (on any rank: the reduced gradients agree)."""

    def __init__(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device, step: StepSettings
    ) -> None:
        self.model = model.to(device)
        if step.compiled:
            self.model.compile()  # in place: the state_dict keeps its keys; the first steps compile
        broadcast_from_main(self.model.state_dict().values())  # every rank starts from rank 0's weights
        self.optimizer = optimizer
        self.device = device
        self.label_smoothing = step.label_smoothing
        self.grad_accum = step.grad_accum
        self.precision = MixedPrecision(step.policy, self.model, device, step.seed, step.batchnorm_16bit)
        self.params = [p for group in optimizer.param_groups for p in group["params"]]
        self.lr = self.shared_lr(optimizer, device)
        self.graphs = CudaGraphs(self, wanted=step.cuda_graphs)
        several_ranks = dist.is_initialized() and dist.get_world_size() > 1
        self.gradients = (
            GradientBuckets(self.params, bucket_mb=step.bucket_mb, overlap=step.overlap)
            if several_ranks
            else LocalGradients(optimizer)
        )

    @staticmethod
    def shared_lr(optimizer: torch.optim.Optimizer, device: torch.device) -> torch.Tensor | None:
        """A 0-dim device tensor that every group's lr is, for an optimizer that takes one without reading it
        back (those that also skip steps on the device: LARS, fused SGD); None for any other."""
        if not getattr(optimizer, "_step_supports_amp_scaling", False):
            return None
        lr = torch.zeros((), device=device)
        for group in optimizer.param_groups:
            group["lr"] = lr
        return lr

    @staticmethod
    def select_device(cfg: NativeConfig, local_rank: int) -> torch.device:
        """The CPU, or the GPU of this rank's local rank; the host's CPU for a simulated device, which runs there."""
        use_threads(cfg.threads)
        if cfg.name == "cpu" or cfg.simulated:
            return torch.device("cpu")
        if not torch.cuda.is_available():
            raise ConfigError("device.name", "cuda was asked for but no CUDA device is available (use device=cpu)")
        if local_rank >= torch.cuda.device_count():
            raise ConfigError("device.name", f"local rank {local_rank} has no GPU ({torch.cuda.device_count()} here)")
        return torch.device("cuda", local_rank)

    @property
    def policy(self) -> Policy:
        return self.precision.policy

    @property
    def loss_scale(self) -> float:
        return self.precision.scaler.scale

    @property
    def skipped_steps(self) -> int:
        return self.precision.scaler.skipped

    @property
    def allreduce_s(self) -> float:
        return self.gradients.waited.seconds

    def train_step(self, images: torch.Tensor, labels: torch.Tensor, lr: float) -> torch.Tensor:
        """One weight update; returns the mean loss on the device. Nothing is read back to the host where the
        optimizer takes its lr and loss scaling's verdict on the device (LARS, fused SGD)."""
        self.model.train()
        self.set_lr(lr)
        images = images.to(self.device, non_blocking=True)
        labels = labels.to(self.device, non_blocking=True)
        return self.graphs.step(images, labels)

    def update(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The step after its lr is set: forward and backward of each pass, the reduced gradients, the update."""
        self.gradients.zero_()
        passes = self.forward_passes(images, labels)
        total = self.run_passes(passes)
        self.gradients.reduce()
        if self.precision.gradients_ready(self.params, self.optimizer):
            self.optimizer.step()
            self.precision.after_update()
        return total / len(passes)

    def restorer(self) -> Callable[[], None]:
        """A function that puts back, in place, what a step changes besides the optimizer: the weights, the loss
        scale and the rounding stream, the BatchNorm statistics."""
        model, precision = copy.deepcopy(self.model.state_dict()), copy.deepcopy(self.precision.state_dict())
        rank_state = copy.deepcopy(self.rank_state_dict())

        def restore() -> None:
            self.model.load_state_dict(model)
            self.precision.load_state_dict(precision)
            self.load_rank_state_dict(rank_state)

        return restore

    def set_lr(self, lr: float) -> None:
        """The step's lr: written into a device tensor the optimizer's groups share where it takes one (the value
        travels with the queued work; a CUDA graph replays it), a float for torch's unfused optimizers, which
        would read a tensor back."""
        if self.lr is None:
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            return
        self.lr.fill_(lr)

    def run_passes(self, passes: list[Pass]) -> torch.Tensor:
        """Forward and backward of every pass, one after another, with `gradients.arm()` before the last
        backward; returns the sum of the passes' losses."""
        total = torch.zeros((), device=self.device)
        for i, (pass_images, pass_labels, scope) in enumerate(passes, 1):
            if i == len(passes):
                self.gradients.arm()  # the update's gradients are complete after this backward
            with scope:
                logits = self.precision.forward(self.model, pass_images)
            total += self.backward_loss(logits, pass_labels, len(passes))
        return total

    def backward_loss(self, logits: torch.Tensor, labels: torch.Tensor, passes: int) -> torch.Tensor:
        """The label-smoothed loss of one of `passes` passes, after its backward (scaled as the policy says and
        weighed 1 / passes, so the update follows the mean loss); returns it detached."""
        loss = smoothed_cross_entropy(logits, labels, self.label_smoothing)
        self.precision.backward(loss / passes)
        return loss.detach()

    def forward_passes(self, images: torch.Tensor, labels: torch.Tensor) -> list[Pass]:
        """The forward passes of one weight update, whose mean losses weigh equally: the `grad_accum`
        micro-batches of this rank's batch."""
        chunks = zip(images.chunk(self.grad_accum), labels.chunk(self.grad_accum), strict=True)
        return [(x, y, contextlib.nullcontext()) for x, y in chunks]

    @property
    def steps_per_call(self) -> int | None:
        return 1  # the host runs every step itself

    def end_call(self) -> None:
        pass

    @torch.no_grad()
    def end_epoch(self) -> None:
        """Average the BatchNorm running statistics over the ranks (they differ where BatchNorm groups do not
        span every rank), so every rank evaluates, and rank 0 checkpoints, the model they share."""
        average_over_ranks(self._running_stats())

    @torch.no_grad()
    def eval_step(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        self.model.eval()
        logits = self.precision.forward(self.model, images.to(self.device, non_blocking=True))
        return (logits.argmax(dim=1) == labels.to(self.device, non_blocking=True)).sum()

    def compile_ahead(self, train_batch: int, eval_batches: Sequence[int], image_size: int, classes: int) -> None:
        """Compile a device.compile model before the clock starts, as MLPerf's init phase may (on synthetic
        batches: the dataset is not touched): one train step and one eval step of each evaluation batch size (a
        last, partial batch would otherwise compile a second shape inside the timed evaluation), after which
        everything they changed is put back (weights, optimizer, BatchNorm statistics, loss scale, rounding
        stream), so the first timed step finds its code compiled and the run unchanged. With device.cuda_graphs the
        train step is then captured too (or the reason it cannot be said), so the first timed step replays it."""
        restore, optimizer_state = self.restorer(), copy.deepcopy(self.optimizer.state_dict())
        generator = torch.Generator().manual_seed(0)
        synthetic = {
            batch: tuple(t.to(self.device) for t in random_batch(batch, image_size, classes, generator))
            for batch in (train_batch, *eval_batches)
        }
        self.model.train()
        self.set_lr(0.0)
        self.update(*synthetic[train_batch])  # never captured: a capture then would keep tensors restore replaces
        for batch in eval_batches:
            self.eval_step(*synthetic[batch])
        restore()
        self.load_optimizer_state(optimizer_state)  # as it was, without the momentum it had not made yet
        self.gradients.waited = Stopwatch(self.gradients.waited.device)  # the epochs' all-reduce time starts at 0
        self.graphs.settle(*synthetic[train_batch])

    def now(self) -> float:
        return time.time()

    @property
    def simulated_clock(self) -> SimulatedClock | None:
        return None

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "precision": self.precision.state_dict(),
        }

    def state_to_come(self) -> int:
        """SGD's and LARS's momentum buffers, one shaped as each parameter of a group with momentum (optim/sgd.py,
        optim/lars.py and torch.optim.SGD make them at the first step)."""
        groups = self.optimizer.param_groups
        made = self.optimizer.state
        return sum(
            p.nbytes for g in groups if g.get("momentum") for p in g["params"] if "momentum_buffer" not in made[p]
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.load_optimizer_state(state["optimizer"])
        self.precision.load_state_dict(state["precision"])

    def load_optimizer_state(self, state: dict[str, Any]) -> None:
        """torch's load, whose groups' lr are the saved ones: the shared device lr is made again (set each step).
        A captured step held the tensors this replaces: it is captured again at the next step."""
        self.optimizer.load_state_dict(state)
        self.lr = self.shared_lr(self.optimizer, self.device)
        self.graphs.drop()

    def rank_state_dict(self) -> dict[str, Any]:
        return {"running_stats": self._running_stats()}

    @torch.no_grad()
    def load_rank_state_dict(self, state: dict[str, Any]) -> None:
        torch._foreach_copy_(self._running_stats(), [s.to(self.device) for s in state["running_stats"]])

    def _running_stats(self) -> list[torch.Tensor]:
        return [
            stat
            for m in self.model.modules()
            if isinstance(m, _BatchNorm)
            for stat in (m.running_mean, m.running_var)
            if stat is not None
        ]


def use_threads(threads: int) -> None:
    """torch's intra-op threads: `threads`, or torch's default for 0."""
    if threads:
        torch.set_num_threads(threads)


def build_native(section: BackendSection, facts: RunFacts, classes: int) -> NativeBackend:
    """ResNet-50 with the configured norm layer and layout, LARS or SGD with the MLPerf parameter groups, and the
    section's step, bound to this rank's device."""
    device = section.device
    layout = {"channels_last": device.channels_last, "four_channel_input": device.pad_input_channels}
    model = build_resnet50(classes, norm_layer(section), section.model.zero_init_residual, **layout)
    return NativeBackend(model, optimizer_for(section, model), facts.device, section.step)


def norm_layer(section: BackendSection) -> NormLayer:
    """BatchNorm2d, or DistributedBatchNorm2d when statistics span several ranks."""
    model, group = section.model, section.bn_group_size
    if group == 1:
        return batchnorm(model.bn_momentum, model.bn_eps)
    return partial(DistributedBatchNorm2d, group_size=group, eps=model.bn_eps, momentum=model.bn_momentum)


def optimizer_for(section: BackendSection, model: nn.Module) -> torch.optim.Optimizer:
    """LARS or SGD as the optim section names it, over the model's MLPerf parameter groups."""
    o = section.optim
    hyper = {"lr": o.base_lr, "momentum": o.momentum, "weight_decay": o.weight_decay, "eta": o.eta}
    return build_optimizer(o.name, model, **hyper, foreach=section.device.foreach)
