"""LARS with the MLPerf reference equations (learning rate inside the momentum buffer)."""

from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

import torch

Scales = list[torch.Tensor] | float | torch.Tensor  # one 0-dim tensor per parameter, or one lr for all of them


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
    parameters instead of ~7 kernels per parameter (ResNet-50 has 161); only adding each gradient and weight
    times its own trust ratio, a 0-dim device tensor, falls back to one kernel per parameter on CUDA (torch's
    multi-tensor fast path wants tensors of equal shape). Neither path allocates a tensor the size of the weights
    (without loss scaling): the update ``lr * trust * (g + wd * w)`` goes into the momentum buffer term by term,
    ``v <- momentum * v + (lr * trust) * g + (lr * trust * wd) * w``, as torch's SGD adds its terms in place; it
    rounds differently from the update formed first, by an ulp, and saves a temporary of 4 bytes per weight
    written and read every step (bench.trace). ``foreach=False`` is the readable per-parameter statement, and what
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
        grad, wd, lr = _grad(p), group["weight_decay"], group["lr"]
        scales: Scales = [lr * _trust_ratio(_norm(p), _norm(grad), group["eta"], wd)] if group["trust"] else lr
        _momentum_then_weights([p], [grad], [self._momentum_buffer(p)], scales, wd, group["momentum"], skip)

    def _step_foreach(self, group: dict[str, Any], params: list[torch.Tensor], skip: torch.Tensor | None) -> None:
        """The same equations for params of one device and dtype, each op over all of them at once."""
        grads, wd, lr = [_grad(p) for p in params], group["weight_decay"], group["lr"]
        scales: Scales = lr
        if group["trust"]:
            dtype = _accumulation_dtype(params[0].dtype)
            w_norm = torch.stack(torch._foreach_norm(params, 2, dtype=dtype))
            g_norm = torch.stack(torch._foreach_norm(grads, 2, dtype=dtype))
            scales = lr * _trust_ratio(w_norm, g_norm, group["eta"], wd)  # stacked: one per parameter
        bufs = [self._momentum_buffer(p) for p in params]
        _momentum_then_weights(params, grads, bufs, scales, wd, group["momentum"], skip)


def _add_scaled(targets: list[torch.Tensor], tensors: list[torch.Tensor], scales: Scales) -> None:
    """targets[i] += scale_i * tensors[i], in place.

    Per-parameter scales (trust ratios times the lr, 0-dim tensors): one addcmul_ each, no temporary (on CUDA one
    kernel per parameter: torch's multi-tensor fast path wants tensors of equal shape). One float: one multi-tensor
    add_. One 0-dim tensor (the lr of a group without trust): on the CPU, where multi-tensor ops loop over the
    tensors anyway, one addcmul_ each; elsewhere a product then a sum, both on the fast path, the product a
    temporary the size of the group (MLPerf's: BatchNorm's parameters and the biases, 0.2% of ResNet-50's
    weights)."""
    if isinstance(scales, torch.Tensor) and scales.device.type == "cpu":
        scales = [scales] * len(targets)
    if isinstance(scales, list):
        torch._foreach_addcmul_(targets, tensors, scales)
    elif isinstance(scales, torch.Tensor):
        torch._foreach_add_(targets, torch._foreach_mul(tensors, scales))
    else:
        torch._foreach_add_(targets, tensors, alpha=scales)


def _momentum_then_weights(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    bufs: list[torch.Tensor],
    scales: Scales,
    wd: float,
    momentum: float,
    skip: torch.Tensor | None,
) -> None:
    """v <- momentum * v + scale * g + (scale * wd) * w, then w <- w - v; neither changes where the 0-dim `skip`
    is nonzero (its gradients may be inf or NaN, so it is a select, not a product). `scales`: the lr (a float or
    a 0-dim tensor) for all of the params, or a list of 0-dim tensors or a 1-dim tensor, one per param.

    The equations' update ``scale * (g + wd * w)`` is added to the buffer term by term, each product rounded on
    its own (a rounding away from the update formed first), and never formed: that would be a temporary the size
    of the weights, allocated and written and read again every step."""
    if isinstance(scales, torch.Tensor) and scales.dim() == 1:
        decays: Scales = list((scales * wd).unbind()) if wd else 0.0
        scales = list(scales.unbind())
    elif isinstance(scales, list):
        decays = [scale * wd for scale in scales] if wd else 0.0
    else:
        decays = scales * wd
    if skip is None:
        torch._foreach_mul_(bufs, momentum)
        targets = bufs
    else:
        targets = list(torch._foreach_mul(bufs, momentum))  # the buffers of a skipped step stay as they were
    _add_scaled(targets, grads, scales)
    if wd:
        _add_scaled(targets, params, decays)
    if skip is None:
        torch._foreach_sub_(params, bufs)
        return
    skipped = skip.bool()
    for buf, new in zip(bufs, targets, strict=True):
        torch.where(skipped, buf, new, out=buf)
    keep = torch.where(skipped, 0.0, -1.0)  # w + v * keep: w - v, or w itself where skipped
    torch._foreach_addcmul_(params, bufs, [keep] * len(params))
