"""MLPerf parameter groups: BN gamma/beta and biases get no weight decay and no LARS trust ratio."""

from typing import Any

import torch


def is_skipped(name: str, param: torch.Tensor) -> bool:
    """True for BN gamma/beta and biases.

    Tested by shape (at most 1-D), not only by name: the reference skips names containing "bn" or "bias",
    which would miss torchvision's downsample BN ("layer1.0.downsample.1.weight").
    """
    return param.ndim <= 1 or name.endswith("bias")


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Two optimizer groups over the trainable parameters: "weights" and "bn_bias"."""
    weights: list[torch.nn.Parameter] = []
    skipped: list[torch.nn.Parameter] = []
    for name, param in model.named_parameters():
        if param.requires_grad:
            (skipped if is_skipped(name, param) else weights).append(param)
    return [
        {"params": weights, "weight_decay": weight_decay, "trust": True, "name": "weights"},
        {"params": skipped, "weight_decay": 0.0, "trust": False, "name": "bn_bias"},
    ]
