"""Where a training step executes. `build` returns a Backend; train.py does not know which one it drives."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from backends.base import Backend
from backends.ipu_sim.backend import IpuSimBackend
from backends.ipu_sim.clock import DeviceClock
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
    replicas: int | None = None,
    bn_group: int = 1,
    clock: DeviceClock | None = None,
    pipeline_splits: Sequence[str] = (),
) -> Backend:
    """The backend for `device`: "cpu", "cuda" or "cuda:N" (native), or "ipu_sim" with `replicas` virtual
    replicas on this rank in BatchNorm groups of `bn_group`. `seed` drives the stochastic rounding of the
    weights; with several ranks, gradients are all-reduced in buckets of `bucket_mb` (None: one), `overlap`ping
    backward. A simulated IPU system's `clock` times its steps (None: one that never moves), and its replicas run
    pipelined, a stage starting at each of `pipeline_splits` (module names)."""
    common = {
        "label_smoothing": label_smoothing,
        "grad_accum": grad_accum,
        "policy": policy,
        "seed": seed,
        "bucket_mb": bucket_mb,
        "overlap": overlap,
    }
    if device == "ipu_sim":
        layout = {"replicas": replicas or 1, "bn_group": bn_group, "clock": clock, "pipeline_splits": pipeline_splits}
        return IpuSimBackend(model, optimizer, torch.device("cpu"), **layout, **common)
    return NativeBackend(model, optimizer, torch.device(device), **common)


__all__ = ["Backend", "IpuSimBackend", "NativeBackend", "build"]
