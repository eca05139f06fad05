"""LARS with the MLPerf reference equations (learning rate inside the momentum buffer)."""

from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

import torch


def _accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """At least fp32, so that norms of fp16/bf16 tensors do not overflow."""
    return torch.promote_types(dtype, torch.float32)


def _norm(x: torch.Tensor) -> torch.Tensor:
    """L2 norm accumulated in at least fp32."""
    norm: torch.Tensor = torch.linalg.vector_norm(x, dtype=_accumulation_dtype(x.dtype))
    return norm


def _trust_ratio(w_norm: torch.Tensor, g_norm: torch.Tensor, eta: float, wd: float) -> torch.Tensor:
    """``eta * ||w|| / (||g|| + wd * ||w||)``, or 1 where either norm is 0; elementwise, so one or many params."""
    ratio = eta * w_norm / (g_norm + wd * w_norm)
    return torch.where((w_norm > 0) & (g_norm > 0), ratio, 1.0)


def _grad(p: torch.Tensor) -> torch.Tensor:
    """The gradient of a parameter that ``step`` kept for having one."""
    assert p.grad is not None
    return p.grad


def _by_device_and_dtype(params: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """Split params into lists of one device and dtype each: what a multi-tensor kernel takes in one launch."""
    buckets: defaultdict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = defaultdict(list)
    for p in params:
        buckets[p.device, p.dtype].append(p)
    return list(buckets.values())


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

    ``foreach=True`` computes the same equations with multi-tensor ops, one launch per op over all of a group's
    parameters instead of ~7 kernels per parameter (ResNet-50 has 161); only scaling each update by its own
    trust ratio, a 0-dim device tensor, falls back to one kernel per parameter on CUDA (torch's multi-tensor
    fast path wants tensors of equal shape). ``foreach=False`` is the readable per-parameter statement, and what
    ``None`` picks for CPU parameters, as torch's own optimizers do: on the CPU the multi-tensor ops loop over the
    tensors anyway, and each op passing over all of the weights in turn keeps none of them in cache.
    ``lr`` may be a 0-dim tensor on the parameters' device: neither path reads a tensor back to the host, so a
    step can be captured in a CUDA graph with the lr updated in place. Loss scaling's verdict is taken as torch's
    GradScaler hands it to fused optimizers (``_step_supports_amp_scaling``): a 0-dim ``found_inf`` attribute,
    1 where some gradient was not finite, in which case the step leaves weights and momentum as they were,
    decided on the device.
    """

    _step_supports_amp_scaling = True

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float | torch.Tensor,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        eta: float = 0.001,
        trust: bool = True,
        foreach: bool | None = None,
    ) -> None:
        lr_ok = isinstance(lr, torch.Tensor) or lr >= 0  # a tensor lr is not read back to be checked
        if not lr_ok or not 0 <= momentum < 1 or weight_decay < 0 or eta <= 0:
            raise ValueError(
                f"LARS needs lr >= 0, 0 <= momentum < 1, weight_decay >= 0, eta > 0; got lr={lr}, "
                f"momentum={momentum}, weight_decay={weight_decay}, eta={eta}"
            )
        defaults = {
            "lr": lr,
            "momentum": momentum,
            "weight_decay": weight_decay,
            "eta": eta,
            "trust": trust,
            "foreach": foreach,
        }
        super().__init__(params, defaults)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load as torch does, but keep this optimizer's ``foreach``.

        ``foreach`` picks an implementation, not a hyperparameter: a checkpoint from either path (or from before
        the option existed) continues on the path this optimizer was built with.
        """
        foreach = [group["foreach"] for group in self.param_groups]
        super().load_state_dict(state_dict)
        for group, value in zip(self.param_groups, foreach, strict=True):
            group["foreach"] = value

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        # one implementation of both of torch's overloads (no closure: None; a closure: its loss), as torch's own
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        skip = getattr(self, "found_inf", None)  # GradScaler's attribute for optimizers that skip on the device
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            for bucket in _by_device_and_dtype(params):
                if group["foreach"] or (group["foreach"] is None and bucket[0].is_cuda):
                    self._step_foreach(group, bucket, skip)
                else:
                    for p in bucket:
                        self._step_one(group, p, skip)
        return loss

    def _momentum_buffer(self, p: torch.Tensor) -> torch.Tensor:
        """The momentum buffer of ``p``, created as zeros on its first step."""
        state = self.state[p]
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        buf: torch.Tensor = state["momentum_buffer"]
        return buf

    def _step_one(self, group: dict[str, Any], p: torch.Tensor, skip: torch.Tensor | None) -> None:
        """The reference equations for one parameter."""
        grad, wd = _grad(p), group["weight_decay"]
        update = grad.add(p, alpha=wd)
        if group["trust"]:
            update.mul_(group["lr"] * _trust_ratio(_norm(p), _norm(grad), group["eta"], wd))
        else:
            update.mul_(group["lr"])
        _momentum_then_weights([p], [self._momentum_buffer(p)], [update], group["momentum"], skip)

    def _step_foreach(self, group: dict[str, Any], params: list[torch.Tensor], skip: torch.Tensor | None) -> None:
        """The same equations for params of one device and dtype, each op over all of them at once."""
        grads, wd = [_grad(p) for p in params], group["weight_decay"]
        updates = list(torch._foreach_add(grads, params, alpha=wd))
        if group["trust"]:
            dtype = _accumulation_dtype(params[0].dtype)
            w_norm = torch.stack(torch._foreach_norm(params, 2, dtype=dtype))
            g_norm = torch.stack(torch._foreach_norm(grads, 2, dtype=dtype))
            scale = group["lr"] * _trust_ratio(w_norm, g_norm, group["eta"], wd)
            torch._foreach_mul_(updates, list(scale.unbind()))
        else:
            torch._foreach_mul_(updates, group["lr"])
        bufs = [self._momentum_buffer(p) for p in params]
        _momentum_then_weights(params, bufs, updates, group["momentum"], skip)


def _momentum_then_weights(
    params: list[torch.Tensor],
    bufs: list[torch.Tensor],
    updates: list[torch.Tensor],
    momentum: float,
    skip: torch.Tensor | None,
) -> None:
    """v <- momentum * v + update, then w <- w - v; neither changes where the 0-dim `skip` is nonzero (its
    updates may be inf or NaN, so it is a select, one per parameter, not a product)."""
    if skip is None:
        torch._foreach_mul_(bufs, momentum)
        torch._foreach_add_(bufs, updates)
        torch._foreach_sub_(params, bufs)
        return
    skipped = skip.bool()
    moved = torch._foreach_mul(bufs, momentum)
    torch._foreach_add_(moved, updates)
    torch._foreach_copy_(bufs, [torch.where(skipped, buf, new) for buf, new in zip(bufs, moved, strict=True)])
    torch._foreach_sub_(params, [torch.where(skipped, 0.0, buf) for buf in bufs])
