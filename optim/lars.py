"""LARS with the MLPerf reference equations (learning rate inside the momentum buffer)."""

from collections.abc import Callable, Iterable
from typing import Any

import torch


def _norm(x: torch.Tensor) -> torch.Tensor:
    """L2 norm accumulated in at least fp32, so fp16/bf16 tensors do not overflow."""
    norm: torch.Tensor = torch.linalg.vector_norm(x, dtype=torch.promote_types(x.dtype, torch.float32))
    return norm


class LARS(torch.optim.Optimizer):
    """Layer-wise adaptive rate scaling as in the MLPerf ResNet-50 reference.

    For each parameter in a group with ``trust=True``:
        trust = eta * ||w|| / (||g|| + wd * ||w||)    (1 when ||w|| or ||g|| is 0; epsilon 0)
        v <- momentum * v + lr * trust * (g + wd * w)
        w <- w - v
    Groups with ``trust=False`` skip the trust ratio: v <- momentum * v + lr * (g + wd * w). MLPerf's skipped
    parameters (BN and biases) also get ``weight_decay=0``, see ``optim.params.param_groups``.
    Putting lr inside the buffer (unlike timm or apex LARC) is what the reference does; the two differ
    whenever lr changes, i.e. throughout warm-up and poly decay.
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        eta: float = 0.001,
        trust: bool = True,
    ) -> None:
        if lr < 0 or not 0 <= momentum < 1 or weight_decay < 0 or eta <= 0:
            raise ValueError(
                f"LARS needs lr >= 0, 0 <= momentum < 1, weight_decay >= 0, eta > 0; got lr={lr}, "
                f"momentum={momentum}, weight_decay={weight_decay}, eta={eta}"
            )
        defaults = {"lr": lr, "momentum": momentum, "weight_decay": weight_decay, "eta": eta, "trust": trust}
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        # one implementation of both of torch's overloads (no closure: None; a closure: its loss), as torch's own
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            wd = group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                update = p.grad.add(p, alpha=wd)
                if group["trust"]:
                    w_norm, g_norm = _norm(p), _norm(p.grad)
                    ratio = group["eta"] * w_norm / (g_norm + wd * w_norm)
                    ratio = torch.where((w_norm > 0) & (g_norm > 0), ratio, 1.0)
                    update.mul_(group["lr"] * ratio)
                else:
                    update.mul_(group["lr"])
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                buf = state["momentum_buffer"]
                buf.mul_(group["momentum"]).add_(update)
                p.sub_(buf)
        return loss
