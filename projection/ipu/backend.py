"""The simulated IPU system's training step: what R data-parallel replicas compute, run on the host.

Replicas are virtual: one process runs them one after another (several processes under torchrun each run
their share). What each replica computes is the IPU's: its micro-batches, BatchNorm over its micro-batch or
over a group of replicas' micro-batches, gradients accumulated over K micro-batches, then one averaged update.
Under an emulated fp16 policy with stochastic rounding, each replica rounds its activations with its own random
stream, as each IPU replica has its own seed; the weight update's stream stays one for all, so their weights agree.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Sequence
from contextlib import AbstractContextManager
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from backends.base import BackendSection, RunFacts, StepSettings
from backends.native import NativeBackend, Pass, optimizer_for
from projection.ipu.clock import DeviceClock
from projection.ipu.config import IpuSimConfig, bn_groups_misfit, pipeline_short_of_micro_batches
from projection.ipu.pipeline import Pipeline


class IpuSimBackend(NativeBackend):
    """NativeBackend's arithmetic (precision policy, bulk all-reduce across ranks, optimizer step) with the
    batch dealt to `replicas` virtual replicas in `grad_accum` micro-batches each.

    The model's BatchNorm layers are plain BatchNorm2d: the `bn_group` replicas of a group run each micro-batch
    as one forward pass, so BatchNorm sees their micro-batches together, which is what the IPUs' distributed
    BatchNorm computes, and their mean loss weighs each replica equally. Each group keeps its own running
    statistics, as its replicas would, averaged over the groups at each epoch's end.

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
        super().__init__(model, optimizer, device, step)
        self.clock = clock or DeviceClock(step_s=0.0, eval_image_s=0.0)  # None: a clock that never moves
        self.seed = step.seed
        ranks, rank = (dist.get_world_size(), dist.get_rank()) if dist.is_initialized() else (1, 0)
        # the global replica of each local one: rank k's replica j takes the samples virtual replica k + W j takes
        self.global_replicas = [rank + ranks * j for j in range(replicas)]
        policy = self.precision.policy
        self.stochastic_activations = policy.emulated and policy.stochastic_rounding
        self.steps = 0
        self.pipeline = Pipeline(self.model, pipeline_splits, sharded) if pipeline_splits else None
        stages = len(self.pipeline.stages) if self.pipeline else 1
        short = pipeline_short_of_micro_batches(stages, self.grad_accum, sharded)
        if why := bn_groups_misfit(bn_group, replicas) or short:
            raise ValueError(why)
        self.replicas = replicas
        self.bn_group = bn_group
        self.running_stats = [stat for m in self.model.modules() if isinstance(m, _BatchNorm) for stat in _stats(m)]
        groups = replicas // bn_group  # one group (or no BatchNorm) keeps the model's own statistics: no swaps
        swapped = groups > 1 and self.running_stats
        self.group_stats = [[s.clone() for s in self.running_stats] for _ in range(groups)] if swapped else []

    def train_step(self, images: torch.Tensor, labels: torch.Tensor, lr: float) -> torch.Tensor:
        self.clock.step()
        self.steps += 1
        return super().train_step(images, labels, lr)

    def eval_step(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """As the native step; the clock moves by the whole evaluation batch, of which every rank has its share."""
        ranks = dist.get_world_size() if dist.is_initialized() else 1
        self.clock.evaluate(len(images) * ranks)
        return super().eval_step(images, labels)

    def now(self) -> float:
        return self.clock.now_s

    @property
    def simulated_clock(self) -> DeviceClock:
        return self.clock

    def forward_passes(self, images: torch.Tensor, labels: torch.Tensor) -> list[Pass]:
        """Replica r takes samples r, r + R, ... of the batch, as the sampler deals samples to ranks, split in
        K micro-batches; each BatchNorm group's k-th micro-batches make one pass."""
        per_replica = [
            (images[r :: self.replicas].chunk(self.grad_accum), labels[r :: self.replicas].chunk(self.grad_accum))
            for r in range(self.replicas)
        ]
        passes: list[Pass] = []
        for g, first in enumerate(range(0, self.replicas, self.bn_group)):
            group = per_replica[first : first + self.bn_group]
            for k in range(self.grad_accum):
                images_k, labels_k = torch.cat([x[k] for x, _ in group]), torch.cat([y[k] for _, y in group])
                scopes = [self._statistics_of_group(g), self._rounding_of(range(first, first + self.bn_group), k)]
                passes.append((images_k, labels_k, _Scopes(scopes)))
        return passes

    def _rounding_of(self, replicas: range, k: int) -> AbstractContextManager[object]:
        """The stochastic-rounding streams of these replicas' k-th micro-batches (their activations' roundings),
        each seeded by the global replica, the step and k alone: the same whether replicas are virtual or ranks,
        pipelined or not, and after a resume."""
        if not self.stochastic_activations:
            return contextlib.nullcontext()
        seeds = [_seed_of(self.seed, self.global_replicas[r], self.steps, k) for r in replicas]
        return self.precision.stochastic_streams([torch.Generator().manual_seed(seed) for seed in seeds])

    def _statistics_of_group(self, g: int) -> AbstractContextManager[object]:
        """The forward pass updates group g's running statistics (one group: the model's own, as they are)."""
        return _Swapped(self.running_stats, self.group_stats[g]) if self.group_stats else contextlib.nullcontext()

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

    def state_dict(self) -> dict[str, Any]:
        return super().state_dict() | {"clock": self.clock.state_dict(), "steps": self.steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.clock.load_state_dict(state["clock"])
        self.steps = state["steps"]

    def rank_state_dict(self) -> dict[str, Any]:
        """The native backend's, and each BatchNorm group's own running statistics."""
        return super().rank_state_dict() | {"group_stats": self.group_stats}

    @torch.no_grad()
    def load_rank_state_dict(self, state: dict[str, Any]) -> None:
        super().load_rank_state_dict(state)
        for group, saved in zip(self.group_stats, state["group_stats"], strict=True):
            torch._foreach_copy_(group, saved)

    @torch.no_grad()
    def end_epoch(self) -> None:
        """The groups' running statistics averaged, then over the ranks, as the native backend does."""
        for i, stat in enumerate(self.running_stats if self.group_stats else []):
            copies = torch.stack([group[i] for group in self.group_stats])
            stat.copy_(copies.mean(0) if stat.is_floating_point() else copies[0])  # batches tracked: alike
        super().end_epoch()
        for group in self.group_stats:
            torch._foreach_copy_(group, self.running_stats)


class _Swapped:
    """A group's running statistics in the model's BatchNorm layers while entered, kept back in the group's copy on
    exit; reusable, as a pipeline enters a pass's scope once per stage.

    The copies go through `.data`, as BatchNorm's own updates do, so autograd's version counters do not move:
    BatchNorm's backward node keeps the running statistics (its training-mode backward never reads them), and a
    pipeline swaps them between a stage's forward and its backward."""

    def __init__(self, live: list[torch.Tensor], kept: list[torch.Tensor]) -> None:
        self.live, self.kept = [t.data for t in live], kept

    def __enter__(self) -> None:
        torch._foreach_copy_(self.live, self.kept)

    def __exit__(self, *exc: object) -> None:
        torch._foreach_copy_(self.kept, self.live)


class _Scopes:
    """Several reusable scopes entered as one, in order, and left in reverse."""

    def __init__(self, scopes: list[AbstractContextManager[object]]) -> None:
        self.scopes = scopes

    def __enter__(self) -> None:
        for scope in self.scopes:
            scope.__enter__()

    def __exit__(self, *exc: Any) -> None:
        for scope in reversed(self.scopes):
            scope.__exit__(*exc)


def _seed_of(*parts: int) -> int:
    """A 63-bit seed that differs whenever any part does."""
    return int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=8).digest(), "little") >> 1


def _nothing() -> None:
    pass


def _stats(bn: _BatchNorm) -> list[torch.Tensor]:
    return [s for s in (bn.running_mean, bn.running_var, bn.num_batches_tracked) if s is not None]


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
