"""What a simulated system's R data-parallel replicas compute, run on the host: the machinery its families share.

Replicas are virtual: one process runs them one after another (several processes under torchrun each run their
share). Each replica computes its micro-batches, BatchNorm over its micro-batch or over a group of replicas'
micro-batches, gradients accumulated over K micro-batches, then one averaged update. Where a system rounds its
16-bit activations stochastically (the IPU's fp16 under an emulated policy with stochastic rounding), each replica
rounds with its own random stream, as each replica has its own seed; the weight update's stream stays one for all,
so their weights agree. A simulated clock (the family's cost model) times the steps.
"""

from __future__ import annotations

import contextlib
import hashlib
from contextlib import AbstractContextManager
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from backends.base import StepSettings
from backends.clock import DeviceClock
from backends.native import NativeBackend, Pass


class ReplicaBackend(NativeBackend):
    """NativeBackend's arithmetic (precision policy, bulk all-reduce across ranks, optimizer step) with the
    batch dealt to `replicas` virtual replicas in `grad_accum` micro-batches each.

    The model's BatchNorm layers are plain BatchNorm2d: the `bn_group` replicas of a group run each micro-batch
    as one forward pass, so BatchNorm sees their micro-batches together, which is what a system's distributed
    BatchNorm computes, and their mean loss weighs each replica equally. Each group keeps its own running
    statistics, as its replicas would, averaged over the groups at each epoch's end.
    """

    rounds_activations_stochastically: ClassVar[bool] = True  # under an emulated policy with stochastic rounding

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
    ) -> None:
        super().__init__(model, optimizer, device, step)
        self.clock = clock or DeviceClock(step_s=0.0, eval_image_s=0.0)  # None: a clock that never moves
        self.seed = step.seed
        ranks, rank = (dist.get_world_size(), dist.get_rank()) if dist.is_initialized() else (1, 0)
        # the global replica of each local one: rank k's replica j takes the samples virtual replica k + W j takes
        self.global_replicas = [rank + ranks * j for j in range(replicas)]
        policy = self.precision.policy
        self.stochastic_activations = (
            self.rounds_activations_stochastically and policy.emulated and policy.stochastic_rounding
        )
        self.steps = 0
        if bn_group < 1 or replicas % bn_group:
            raise ValueError(f"BatchNorm groups of {bn_group} replicas must divide the {replicas} replicas of a rank")
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

    @property
    def steps_per_call(self) -> int | None:
        return self.clock.steps_per_call

    def end_call(self) -> None:
        self.clock.end_call()

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
        """The call under way ends with the epoch; the groups' running statistics averaged, then over the ranks, as
        the native backend does."""
        self.clock.end_call()
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


def _stats(bn: _BatchNorm) -> list[torch.Tensor]:
    return [s for s in (bn.running_mean, bn.running_var, bn.num_batches_tracked) if s is not None]
