"""The simulated IPU system's training step: what R data-parallel replicas compute, run on the host.

Replicas are virtual: one process runs them one after another (several processes under torchrun each run
their share). What each replica computes is the IPU's: its micro-batches, BatchNorm over its micro-batch or
over a group of replicas' micro-batches, gradients accumulated over K micro-batches, then one averaged update.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from backends.native import NativeBackend, Pass


class IpuSimBackend(NativeBackend):
    """NativeBackend's arithmetic (precision policy, bulk all-reduce across ranks, optimizer step) with the
    batch dealt to `replicas` virtual replicas in `grad_accum` micro-batches each.

    The model's BatchNorm layers are plain BatchNorm2d: the `bn_group` replicas of a group run each micro-batch
    as one forward pass, so BatchNorm sees their micro-batches together, which is what the IPUs' distributed
    BatchNorm computes, and their mean loss weighs each replica equally. Each group keeps its own running
    statistics, as its replicas would, averaged over the groups at each epoch's end.
    """

    def __init__(self, *args: Any, replicas: int, bn_group: int = 1, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if replicas % bn_group:
            raise ValueError(f"a BatchNorm group of {bn_group} replicas does not divide {replicas} replicas")
        self.replicas = replicas
        self.bn_group = bn_group
        self.running_stats = [stat for m in self.model.modules() if isinstance(m, _BatchNorm) for stat in _stats(m)]
        groups = replicas // bn_group  # one group keeps the model's own statistics: nothing to swap
        self.group_stats = [[s.clone() for s in self.running_stats] for _ in range(groups)] if groups > 1 else []

    def forward_passes(self, images: torch.Tensor, labels: torch.Tensor) -> list[Pass]:
        """Replica r takes samples r, r + R, ... of the batch, as the sampler deals samples to ranks, split in
        K micro-batches; each BatchNorm group's k-th micro-batches make one pass."""
        per_replica = [
            (images[r :: self.replicas].chunk(self.grad_accum), labels[r :: self.replicas].chunk(self.grad_accum))
            for r in range(self.replicas)
        ]
        passes = []
        for g, first in enumerate(range(0, self.replicas, self.bn_group)):
            group = per_replica[first : first + self.bn_group]
            for k in range(self.grad_accum):
                images_k, labels_k = torch.cat([x[k] for x, _ in group]), torch.cat([y[k] for _, y in group])
                passes.append((images_k, labels_k, self._statistics_of_group(g)))
        return passes

    def _statistics_of_group(self, g: int) -> AbstractContextManager:
        """The forward pass updates group g's running statistics (one group: the model's own, as they are)."""
        return self._swapped_statistics(g) if self.group_stats else contextlib.nullcontext()

    @contextmanager
    def _swapped_statistics(self, g: int) -> Iterator[None]:
        torch._foreach_copy_(self.running_stats, self.group_stats[g])
        yield
        torch._foreach_copy_(self.group_stats[g], self.running_stats)

    @torch.no_grad()
    def end_epoch(self) -> None:
        """The groups' running statistics averaged, then over the ranks, as the native backend does."""
        for i, stat in enumerate(self.running_stats if self.group_stats else []):
            copies = torch.stack([group[i] for group in self.group_stats])
            stat.copy_(copies.mean(0) if stat.is_floating_point() else copies[0])  # batches tracked: alike
        super().end_epoch()
        for group in self.group_stats:
            torch._foreach_copy_(group, self.running_stats)


def _stats(bn: _BatchNorm) -> list[torch.Tensor]:
    return [s for s in (bn.running_mean, bn.running_var, bn.num_batches_tracked) if s is not None]
