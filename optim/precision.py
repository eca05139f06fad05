"""Precision policies: the activation (compute) dtype, the master-weight dtype, and loss scaling.

A policy is applied to a model by `MixedPrecision`:

- Compute in bf16 or fp16 runs under torch.autocast: activations and the per-op compute copies of the weights
  are 16-bit, the weights the optimizer owns stay fp32 tensors. Where the 16-bit arithmetic is slow it is
  emulated instead: on every CPU for fp16 (several times slower than fp32), and for bf16 on a CPU without bf16
  instructions (`cpu_has_native_bf16`). Emulated, everything computes in fp32, and the image entering the first
  layer, every layer's output and the compute copy of the convolution and linear weights are rounded to the
  16-bit type, which are the numbers a 16-bit device stores (the casts also round the gradients flowing back
  through them). Inside `stochastic_streams(generators)` the outputs are rounded stochastically instead, each
  of the batch's equal shares with its own stream: the IPU's 16-bit arithmetic with a different seed on every
  replica.
- A 16-bit master (the ".16" policies) is kept as fp32 tensors that hold 16-bit values: after each update the
  optimizer's fp32 result is rounded back, stochastically (unbiased, seeded per rank) or to nearest, in one
  pass over one flat buffer that those weights are views of. Only convolution and linear weights have 16-bit
  masters.
- BatchNorm (statistics and parameters), the loss and the optimizer's arithmetic run in fp32 under every
  policy: BatchNorm's input is cast to fp32 by a hook, its parameters are never cast. With `batchnorm_16bit`,
  native 16-bit compute gives BatchNorm its 16-bit input as it is: PyTorch's CPU and CUDA kernels (cuDNN's for
  fp16) accumulate the statistics in fp32 with fp32 weights, and return the input's dtype, which the next
  convolution would cast to anyway; the cast and its saved fp32 copy are what it spares.
- Loss scaling multiplies the loss before backward and divides the gradients after it. Dynamic scaling skips
  an update whose gradients are not finite, halves the scale, and doubles it after `growth_interval` good
  updates. An optimizer that skips on the device (LARS, fused SGD) is told, and the step reads nothing back;
  with any other, the check is one host sync per update.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import nn
from torch.func import functional_call

from optim.config import COMPUTE_DTYPES, PrecisionConfig
from optim.stochastic_rounding import round_stochastic

DTYPES = dict(zip(COMPUTE_DTYPES, (torch.float32, torch.bfloat16, torch.float16), strict=True))
LOW_PRECISION_LAYERS = (nn.Conv2d, nn.Linear)  # the layers whose weights have 16-bit compute copies and masters
ROUNDED_LAYERS = (nn.Conv2d, nn.Linear, nn.BatchNorm2d, nn.ReLU, nn.MaxPool2d, nn.AdaptiveAvgPool2d)


class NonFiniteLoss(RuntimeError):
    """The loss or its gradients stayed non-finite: loss scaling skipped too many updates in a row."""


@dataclass
class Policy(PrecisionConfig):
    """A precision configuration as one device runs it: its emulation choice resolved for that device."""

    emulated: bool = False  # 16-bit compute done in fp32, rounded per layer (the CPU path)
    max_skipped: int = 32  # updates skipped in a row before the run is stopped

    @classmethod
    def for_device(cls, config: PrecisionConfig, device_type: str) -> Policy:
        """The policy `config` names, on a device of `device_type` ("cpu", "cuda")."""
        emulated = emulates(config.compute, config.emulate, device_type)
        return cls(**{f.name: getattr(config, f.name) for f in fields(PrecisionConfig)}, emulated=emulated)

    def describe(self) -> str:
        how = f"emulated: fp32 arithmetic rounded to {self.compute} per layer" if self.emulated else "native"
        rounding = "stochastic" if self.stochastic_rounding else "to nearest"
        master = self.master if self.master == "fp32" else f"{self.master}, rounded {rounding}"
        return f"{self.name}: compute {self.compute} ({how}), master weights {master}, loss scaling {self.loss_scaling}"


class LossScaler:
    """Static or dynamic loss scaling, kept on the device: the scale, the good updates towards doubling it and the
    skipped ones (in a row, and in all) are tensors each update changes without reading them back."""

    def __init__(
        self, mode: str, init_scale: float, growth_interval: int, max_skipped: int, device: torch.device
    ) -> None:
        self.mode = mode
        self.growth_interval = growth_interval
        self.max_skipped = max_skipped
        self.scale_tensor = torch.full((), init_scale if mode != "none" else 1.0, device=device)
        self.good_steps = torch.zeros((), dtype=torch.int32, device=device)  # torch's growth tracker is int32
        self.skipped_in_a_row = torch.zeros((), dtype=torch.int64, device=device)
        self.skipped_tensor = torch.zeros((), dtype=torch.int64, device=device)
        self.unchecked = 0  # updates since the skips in a row were last read

    @property
    def enabled(self) -> bool:
        return self.mode != "none"

    @property
    def scale(self) -> float:
        return float(self.scale_tensor)

    @property
    def skipped(self) -> int:
        return int(self.skipped_tensor)

    def update(self, found_inf: torch.Tensor) -> None:
        """Account for one update attempt (`found_inf` 1: skipped): a skip halves a dynamic scale, and
        `growth_interval` good updates in a row double it, as torch's GradScaler does, on the device."""
        if self.mode == "dynamic":
            torch._amp_update_scale_(self.scale_tensor, self.good_steps, found_inf, 2.0, 0.5, self.growth_interval)
        skipped = found_inf.to(torch.int64)
        self.skipped_tensor.add_(skipped)
        self.skipped_in_a_row.add_(skipped).mul_(skipped)  # +1 on a skip, back to 0 on a good update
        self.unchecked += 1

    def check(self, every: int = 1) -> None:
        """Every `every` updates, read the skips in a row (a host sync): NonFiniteLoss after `max_skipped`."""
        if self.unchecked < every:
            return
        self.unchecked = 0
        in_a_row = int(self.skipped_in_a_row)
        if in_a_row >= self.max_skipped:
            raise NonFiniteLoss(f"{in_a_row} updates in a row had non-finite gradients (loss scale now {self.scale:g})")

    def replayed(self) -> None:
        """An update ran in a replayed CUDA graph, whose Python (`update`'s count) ran once, at the capture."""
        self.unchecked += 1
        self.check(every=self.max_skipped)

    def state_dict(self) -> dict[str, Any]:
        return {key: tensor.item() for key, tensor in self._state().items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, tensor in self._state().items():
            tensor.fill_(state[key])

    def _state(self) -> dict[str, torch.Tensor]:
        """The checkpoint's keys (numbers there, as before the state moved to the device) and their tensors."""
        return {
            "scale": self.scale_tensor,
            "good_steps": self.good_steps,
            "skipped_in_a_row": self.skipped_in_a_row,
            "skipped": self.skipped_tensor,
        }


class MixedPrecision:
    """A policy bound to one model: forward, backward, gradient checks and the rounding of master weights."""

    def __init__(
        self, policy: Policy, model: nn.Module, device: torch.device, seed: int, batchnorm_16bit: bool = False
    ) -> None:
        self.policy = policy
        self.device = device
        self.compute = DTYPES[policy.compute]
        self.master = DTYPES[policy.master]
        self.scaler = LossScaler(
            policy.loss_scaling, policy.init_scale, policy.growth_interval, policy.max_skipped, device
        )
        self.generator = torch.Generator(device).manual_seed(seed)  # the stochastic-rounding stream of this rank
        self.streams: Sequence[torch.Generator] = ()  # emulated outputs round with these, one per batch share
        self.low_precision = {
            f"{prefix}.{name}" if prefix else name: param
            for prefix, module in model.named_modules()
            if isinstance(module, LOW_PRECISION_LAYERS)
            for name, param in module.named_parameters(recurse=False)
        }
        native_16bit = self.compute != torch.float32 and not policy.emulated
        for module in model.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm) and not (batchnorm_16bit and native_16bit):
                module.register_forward_pre_hook(_inputs_in_fp32)
            if policy.emulated and isinstance(module, ROUNDED_LAYERS):
                module.register_forward_hook(self._output_rounded)
        if policy.emulated:
            first = next(m for m in model.modules() if isinstance(m, LOW_PRECISION_LAYERS))
            first.register_forward_pre_hook(self._input_rounded)  # the image, as the device stores it
        # 16-bit masters: the weights become views of one buffer, which each update rounds in one pass
        self.masters = flatten(list(self.low_precision.values())) if self.master != torch.float32 else None
        if self.masters is not None:
            self._round_masters(stochastic=False)  # start from the 16-bit values nearest the initialisation

    def forward(self, model: nn.Module, images: torch.Tensor) -> torch.Tensor:
        """The logits, under the policy's compute dtype."""
        if self.policy.emulated:
            rounded = {name: p.to(self.compute).to(torch.float32) for name, p in self.low_precision.items()}
            logits: torch.Tensor = functional_call(model, rounded, (images,), strict=False)
            return logits
        with self.autocast():
            logits = model(images)
            return logits

    def stochastic_streams(self, generators: Sequence[torch.Generator]) -> StochasticStreams:
        """While entered, emulated 16-bit layer outputs are rounded stochastically, the batch cut into
        len(generators) equal shares, each rounded with its own generator."""
        return StochasticStreams(self, generators)

    def _output_rounded(self, module: nn.Module, inputs: Any, output: torch.Tensor) -> torch.Tensor:
        """The output as a 16-bit device stores it: rounded to nearest, or stochastically inside
        `stochastic_streams`; either way its gradient is rounded on the way back, as the cast rounds it."""
        if not self.streams:
            return output.to(self.compute).to(torch.float32)
        rounded: torch.Tensor = _RoundedStochastically.apply(output, self.compute, self.streams)
        return rounded

    def _input_rounded(self, module: nn.Module, inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        """The first layer's input (the normalised image, which no rounded layer has output) in the 16-bit type,
        as autocast casts it; every later layer's input is already some layer's rounded output."""
        return (inputs[0].to(self.compute).to(torch.float32), *inputs[1:])

    def autocast(self) -> contextlib.AbstractContextManager[object]:
        if self.compute == torch.float32 or self.policy.emulated:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.compute)

    def backward(self, loss: torch.Tensor) -> None:
        (loss * self.scaler.scale_tensor if self.scaler.enabled else loss).backward()

    def gradients_ready(self, params: list[torch.Tensor], optimizer: torch.optim.Optimizer) -> bool:
        """Unscale the gradients; False (and no update) when loss scaling found one that is not finite.

        An optimizer that skips a step on the device (torch's `_step_supports_amp_scaling`: LARS, fused SGD) is
        handed the verdict as GradScaler hands it, and the step reads nothing back; the skips in a row are read
        every `max_skipped` updates. Any other optimizer's step waits for the verdict on the host."""
        if not self.scaler.enabled:
            return True
        grads = [p.grad for p in params if p.grad is not None]
        found_inf = torch.zeros((), device=self.device)
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, self.scaler.scale_tensor.reciprocal())
        self.scaler.update(found_inf)
        if getattr(optimizer, "_step_supports_amp_scaling", False):
            optimizer.found_inf = found_inf  # type: ignore[attr-defined]
            self.scaler.check(every=self.scaler.max_skipped)
            return True
        self.scaler.check()
        return not bool(found_inf)  # the host sync of a loss-scaled step

    def replayed(self) -> None:
        """A captured step was replayed: loss scaling counts it, as the captured Python did once."""
        if self.scaler.enabled:
            self.scaler.replayed()

    @torch.no_grad()
    def after_update(self) -> None:
        """Bring 16-bit masters back onto their grid after the optimizer's fp32 arithmetic."""
        if self.masters is not None:
            self._round_masters(stochastic=self.policy.stochastic_rounding)

    @torch.no_grad()
    def _round_masters(self, stochastic: bool) -> None:
        assert self.masters is not None
        if stochastic:
            self.masters.copy_(round_stochastic(self.masters, self.master, self.generator))
        else:
            self.masters.copy_(self.masters.to(self.master))

    def state_dict(self) -> dict[str, Any]:
        return {"scaler": self.scaler.state_dict(), "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scaler.load_state_dict(state["scaler"])
        self.generator.set_state(state["generator"])


@torch.no_grad()
def flatten(params: list[torch.Tensor]) -> torch.Tensor:
    """One flat fp32 buffer holding `params`' values, each param's data made a view of its part with its own
    shape and strides (contiguous or channels-last), so an op over the buffer is an op over every param. The
    params stay the same objects: optimizers, hooks and state_dict loading (which copies in place) see no change."""
    flat = torch.empty(sum(p.numel() for p in params), dtype=torch.float32, device=params[0].device)
    offset = 0
    for param in params:
        if not (param.is_contiguous() or param.is_contiguous(memory_format=torch.channels_last)):
            raise ValueError(f"a parameter of shape {tuple(param.shape)} has strides {param.stride()}, not a layout")
        view = flat.as_strided(param.shape, param.stride(), offset)
        view.copy_(param)
        param.data = view
        offset += param.numel()
    return flat


class StochasticStreams:
    """MixedPrecision.stochastic_streams: reusable, as a pipeline enters a pass's scope once per stage."""

    def __init__(self, precision: MixedPrecision, generators: Sequence[torch.Generator]) -> None:
        self.precision, self.generators = precision, generators

    def __enter__(self) -> None:
        self.precision.streams = self.generators

    def __exit__(self, *exc: object) -> None:
        self.precision.streams = ()


class _RoundedStochastically(torch.autograd.Function):
    """fp32 values rounded stochastically to fp16 or bf16, each equal share of the batch with its own generator;
    the gradient is rounded to the same type on the way back, as a cast rounds it."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, dtype: torch.dtype, streams: Sequence[torch.Generator]) -> torch.Tensor:
        ctx.dtype = dtype
        rounded = torch.empty_like(x)
        for share, into, generator in zip(x.chunk(len(streams)), rounded.chunk(len(streams)), streams, strict=True):
            into.copy_(round_stochastic(share, dtype, generator))
        return rounded

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return grad.to(ctx.dtype).to(grad.dtype), None, None


def _inputs_in_fp32(module: nn.Module, inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    return (inputs[0].to(torch.promote_types(inputs[0].dtype, torch.float32)),)  # float64 stays float64


# oneDNN's names (ONEDNN_MAX_CPU_ISA, dnnl::cpu_isa) for the instruction sets that hold AVX512_BF16's bf16 dot
# products or AMX: https://oneapi-src.github.io/oneDNN/dev_guide_cpu_dispatcher_control.html
BF16_ISAS = {
    "AVX512_CORE_BF16",
    "AVX10_1_512",
    "AVX512_CORE_FP16",
    "AVX10_1_512_AMX",
    "AVX512_CORE_AMX",
    "AVX10_1_512_AMX_FP16",
    "AVX512_CORE_AMX_FP16",
    "ALL",
    "DEFAULT",
}


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bf16 natively, as torch reports it: cpuinfo finds AVX512_BF16 or AMX, and oneDNN
    may use them (ONEDNN_MAX_CPU_ISA, set to reproduce another host, does not cap it below them). Without them
    oneDNN's bf16 convolutions are slower than fp32 emulation (docs/precision.md has the figures)."""
    hardware = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "ALL").upper()
    return hardware and cap in BF16_ISAS and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def emulates(compute: str, emulate: str, device_type: str) -> bool:
    """Whether 16-bit compute is emulated in fp32: `emulate` is always, never, or auto: fp16 on the CPU (its fp16
    arithmetic is slow everywhere) and bf16 on a CPU without native bf16."""
    if compute == "fp32" or emulate == "never":
        return False
    if emulate == "always":
        return True
    return device_type == "cpu" and (compute == "fp16" or not cpu_has_native_bf16())
