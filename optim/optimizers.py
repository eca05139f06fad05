"""LARS or SGD over the MLPerf parameter groups, as the config names them."""

import torch

from optim.config import OPTIMIZERS
from optim.lars import LARS
from optim.params import param_groups
from optim.sgd import FusedSGD


def build_optimizer(
    name: str,
    model: torch.nn.Module,
    *,
    lr: float,
    momentum: float,
    weight_decay: float,
    eta: float = 0.001,
    foreach: bool | None = None,
) -> torch.optim.Optimizer:
    """LARS or SGD over ``param_groups(model, weight_decay)`` (SGD ignores the groups' "trust" key). `foreach`:
    True, the step as multi-tensor kernels (SGD: torch's fused one, which also takes a device lr and skips a step
    on the device as LARS does); False, per parameter; None, multi-tensor for CUDA parameters only (SGD: torch's
    foreach, whose tensor lr and skips are read on the host)."""
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; expected one of: {', '.join(OPTIMIZERS)}")
    groups = param_groups(model, weight_decay)
    if name == "lars":
        return LARS(groups, lr=lr, momentum=momentum, eta=eta, foreach=foreach)
    if foreach:
        return FusedSGD(groups, lr=lr, momentum=momentum)
    return torch.optim.SGD(groups, lr=lr, momentum=momentum, nesterov=False, foreach=foreach)
