"""Where a training step executes. `build` returns a Backend; train.py does not know which one it drives."""

from __future__ import annotations

import torch
from torch import nn

from backends.base import Backend
from backends.native import NativeBackend
from optim.precision import Policy


def build(
    device: str,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    label_smoothing: float,
    grad_accum: int = 1,
    policy: Policy | None = None,
    seed: int = 0,
    bucket_mb: float | None = None,
    overlap: bool = False,
) -> Backend:
    """The backend for `device` ("cpu", "cuda" or "cuda:N"); `seed` drives the stochastic rounding of the weights;
    with several ranks, gradients are all-reduced in buckets of `bucket_mb` (None: one), `overlap`ping backward."""
    return NativeBackend(
        model,
        optimizer,
        torch.device(device),
        label_smoothing=label_smoothing,
        grad_accum=grad_accum,
        policy=policy,
        seed=seed,
        bucket_mb=bucket_mb,
        overlap=overlap,
    )


__all__ = ["Backend", "NativeBackend", "build"]
