"""torch's fused SGD, with the one repair a step skipped on the device needs."""

from collections.abc import Callable
from typing import Any

import torch


class FusedSGD(torch.optim.SGD):
    """`torch.optim.SGD(fused=True)`: one multi-tensor kernel per step that takes a device lr and loss scaling's
    verdict (`found_inf`, as GradScaler hands it). Its momentum buffers start as zeros here: torch creates them
    with `empty_like` on the first step and fills them in that step's kernel, so a first step skipped for a
    non-finite gradient (as fp16's first steps often are) leaves them uninitialised for every step after
    (torch/optim/sgd.py, `_fused_sgd`). From zeros, the first step's buffer is its gradient, as torch's is."""

    def __init__(self, params: list[dict[str, Any]], lr: float, momentum: float) -> None:
        super().__init__(params, lr=lr, momentum=momentum, nesterov=False, fused=True)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        for group in self.param_groups:
            for p in group["params"]:
                if group["momentum"] and "momentum_buffer" not in self.state[p]:
                    self.state[p]["momentum_buffer"] = torch.zeros_like(p)
        loss: float | None = super().step(closure)
        return loss
