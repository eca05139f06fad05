"""BatchNorm2d whose batch statistics span a group of consecutive ranks.

With small per-rank batches the batch statistics get noisy, so large-scale ResNet-50 runs normalise over the
batches of a few ranks together. `torch.nn.SyncBatchNorm` does this only for CUDA tensors; this layer works on
any device and backend (gloo on CPU, nccl on CUDA) with one all-reduce per layer in forward and one in backward.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.autograd.function import once_differentiable

from distributed.group import collective_timeout

_DIMS = (0, 2, 3)  # every dimension but the channels


def _world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _check_group_size(group_size: int, world_size: int) -> None:
    if group_size < 1 or (world_size > 1 and world_size % group_size):
        raise ValueError(f"BatchNorm group_size={group_size} must be >= 1 and divide the world size {world_size}")


@functools.cache
def _subgroup(group_size: int, world_size: int) -> dist.ProcessGroup:
    """This rank's group of `group_size` consecutive ranks of the default process group.

    Every rank creates every group, in the same order (a collective), once: the layers of a model share them.
    Made at the first training forward, not in __init__, so that a model may be built before the process group.
    The cache outlives the default group: a process that re-initialises it must call `_subgroup.cache_clear()`.
    """
    _check_group_size(group_size, world_size)
    return dist.new_subgroups(group_size, timeout=collective_timeout())[0]


def _per_channel(t: torch.Tensor) -> torch.Tensor:
    return t[None, :, None, None]


class _GroupBatchNorm(torch.autograd.Function):
    """Batch normalisation with the statistics of the whole group; returns (output, mean, unbiased variance).

    The arithmetic runs in the input dtype promoted to at least float32: bf16/fp16 inputs get fp32 statistics,
    float64 inputs float64 ones. Sums of x and x² keep the forward to one all-reduce of 2C+1 numbers, at a price in
    fp32: the variance E[x²] - E[x]² loses digits when a channel's mean is many standard deviations from 0.
    """

    @staticmethod
    def forward(
        ctx: Any,  # a FunctionCtx, whose annotations know neither saved_tensors nor attributes set on it
        x: torch.Tensor,
        weight: torch.Tensor | None,
        bias: torch.Tensor | None,
        eps: float,
        group: dist.ProcessGroup,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        dtype = torch.promote_types(x.dtype, torch.float32)
        xf = x.to(dtype)
        channels = x.shape[1]
        count = torch.full((1,), x.numel() // channels, dtype=dtype, device=x.device)
        stats = torch.cat([xf.sum(_DIMS), (xf * xf).sum(_DIMS), count])
        dist.all_reduce(stats, group=group)  # the count is reduced too: ranks may have different batch sizes
        total, total_sq, count = stats[:channels], stats[channels:-1], stats[-1]
        mean = total / count
        var = (total_sq / count - mean * mean).clamp_(min=0)
        invstd = torch.rsqrt(var + eps)
        scale = invstd if weight is None else weight.to(dtype) * invstd
        shift = -mean * scale if bias is None else bias.to(dtype) - mean * scale
        y = torch.addcmul(_per_channel(shift), xf, _per_channel(scale)).to(x.dtype)
        ctx.save_for_backward(x, weight, mean, invstd, count)
        ctx.group = group
        unbiased_var = var * count / (count - 1)
        ctx.mark_non_differentiable(mean, unbiased_var)
        return y, mean, unbiased_var

    @staticmethod
    @once_differentiable
    def backward(
        ctx: Any, dy: torch.Tensor, _dmean: torch.Tensor, _dvar: torch.Tensor
    ) -> tuple[torch.Tensor | None, ...]:
        x, weight, mean, invstd, count = ctx.saved_tensors
        dtype = mean.dtype
        dyf = dy.to(dtype)
        centred = x.to(dtype) - _per_channel(mean)  # xhat = centred * invstd; a fresh tensor, reused for dx
        sum_dy, sum_dy_centred = dyf.sum(_DIMS), (dyf * centred).sum(_DIMS)
        group_sums = torch.cat([sum_dy, sum_dy_centred])  # a copy: the weight and bias gradients stay local
        dist.all_reduce(group_sums, group=ctx.group)
        mean_dy, mean_dy_centred = (group_sums / count).chunk(2)
        scale = invstd if weight is None else weight.to(dtype) * invstd
        # dx = scale * (dy - mean(dy) - xhat * mean(dy * xhat)), computed in place: few passes over the batch
        dx = centred.mul_(_per_channel(-scale * invstd * invstd * mean_dy_centred))
        dx.addcmul_(dyf, _per_channel(scale)).sub_(_per_channel(scale * mean_dy))
        grad_weight = (sum_dy_centred * invstd).to(weight.dtype) if ctx.needs_input_grad[1] else None
        grad_bias = sum_dy.to(weight.dtype) if ctx.needs_input_grad[2] else None
        return dx.to(x.dtype), grad_weight, grad_bias, None, None


class DistributedBatchNorm2d(nn.BatchNorm2d):
    """`nn.BatchNorm2d` whose training-mode batch statistics are those of the batches of `group_size` consecutive
    ranks of the default process group together (ranks [0, g), [g, 2g), ...).

    With group_size 1, without a process group or with a single rank it is plain BatchNorm2d (the native kernel).
    Running statistics are updated exactly as BatchNorm2d does on the group's concatenated batch (momentum=None,
    the cumulative average, included), so they stay identical across the group. Eval mode is BatchNorm2d's, local
    to each rank. The weight and bias gradients are this rank's share: averaging them
    across ranks, as the gradient all-reduce does, gives the gradient of the mean loss.
    """

    def __init__(
        self,
        num_features: int,
        group_size: int = 1,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
    ) -> None:
        _check_group_size(group_size, _world_size())
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.group_size = group_size

    def extra_repr(self) -> str:
        # BatchNorm's extra_repr has no annotations (and mypy's untyped_calls_exclude does not cover super())
        return f"{super().extra_repr()}, group_size={self.group_size}"  # type: ignore[no-untyped-call]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        world_size = _world_size()
        if not self.training or self.group_size == 1 or world_size == 1:
            return super().forward(x)
        self._check_input_dim(x)
        group = _subgroup(self.group_size, world_size)
        outputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor] = _GroupBatchNorm.apply(
            x, self.weight, self.bias, self.eps, group
        )
        y, mean, unbiased_var = outputs
        if self.track_running_stats:
            running_mean, running_var, batches = self.running_mean, self.running_var, self.num_batches_tracked
            assert running_mean is not None and running_var is not None and batches is not None  # tracked, so kept
            with torch.no_grad():
                batches.add_(1)
                momentum = 1 / batches.item() if self.momentum is None else self.momentum
                running_mean.lerp_(mean.to(running_mean.dtype), momentum)
                running_var.lerp_(unbiased_var.to(running_var.dtype), momentum)
        return y
