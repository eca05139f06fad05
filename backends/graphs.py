"""device.cuda_graphs: the whole train step (forward, backward, the update) captured once in a CUDA graph, then
replayed each step with the batch copied into the graph's input buffers.

The recipe is PyTorch's "whole network capture" (torch.cuda.graphs docs): a few steps on a side stream first
(cuDNN and the allocator settle, the optimizer's state exists), then the capture, gradients set to None inside
it so that backward allocates them from the graph's pool. A graph freezes every value the host handed a kernel
at capture time, so it is only taken where the step reads nothing from the host and no Python number changes
between steps: the lr and loss scaling's verdict live on the device (LARS, fused SGD), masters are fp32 (16-bit
masters round with a generator of their own) and one rank trains (the gradient all-reduce is not captured).
Elsewhere the step runs eagerly, and the run says why.

A backend holds one `CudaGraphs` and asks it one thing at each place: its train step, the capture ahead of the clock
(the init phase), and dropping the graph when a state load replaces the tensors it holds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch
import torch.distributed as dist

from optim.precision import MixedPrecision

Step = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
WARMUP_STEPS = 3
# Only this thread's CUDA calls may not break the capture: the DataLoader's pin-memory thread pins the next batches
# while the step is captured in train.py, which the default ("global") refuses (cudaErrorStreamCaptureInvalidated,
# the GPU check of 2026-11-27); torch.cuda.graph's docs name "thread_local" for such a thread.
CAPTURE_ERROR_MODE = "thread_local"


class Capturable(Protocol):
    """The backend whose step is captured (backends.native.NativeBackend): its eager step, where it runs, what its
    step reads from the host, and what puts back the state a step changes."""

    device: torch.device
    lr: torch.Tensor | None  # the lr on the device, shared by the optimizer's groups; None: read on the host
    optimizer: torch.optim.Optimizer
    precision: MixedPrecision

    def update(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor: ...

    def restorer(self) -> Callable[[], None]:
        """A function that puts back, in place, what a step changes besides the optimizer's state."""
        ...


class CudaGraphs:
    """A backend's train step under device.cuda_graphs: captured once, at the first step or ahead of the clock
    (where it cannot be, the reason said then, and the step eager from then on), replayed at every step after, and
    captured again after a state load replaced the tensors the graph held."""

    def __init__(self, backend: Capturable, wanted: bool) -> None:
        self.backend = backend
        self.pending = wanted  # a capture to try at the next chance (device.cuda_graphs)
        self.captured: GraphedStep | None = None

    def step(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The step on this batch: replayed where it is captured (a pending capture tried first), else eager."""
        self.settle(images, labels)
        if self.captured is None:
            return self.backend.update(images, labels)
        loss = self.captured(images, labels)
        self.backend.precision.replayed()
        return loss

    def settle(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        """A pending capture tried now, from this batch's shapes (compile_ahead's synthetic batch in the init phase,
        or the first step's): the step captured, or the reason it cannot be said. It is tried once."""
        if not self.pending:
            return
        self.pending = False
        why = self.why_not()
        if why is not None:
            print(f"device.cuda_graphs: {why}; the step runs eagerly", flush=True)
            return
        self.captured = GraphedStep(self.backend.update, images, labels, self.restorer())

    def drop(self) -> None:
        """A state load replaced tensors the graph held (the optimizer's): the step is captured again at the next
        one."""
        if self.captured is not None:
            self.captured, self.pending = None, True

    def why_not(self) -> str | None:
        """Why the backend's step cannot be captured, or None where it can."""
        backend = self.backend
        ranks = dist.get_world_size() if dist.is_initialized() else 1
        fp32_masters = backend.precision.policy.master == "fp32"
        return why_not_captured(backend.device, backend.lr is not None, fp32_masters, ranks)

    def restorer(self) -> Callable[[], None]:
        """A function that undoes the warm-up steps before the capture, in place, as the graph keeps the tensors it
        captured: the backend's state, and the optimizer's (zeroed where the warm-up made it)."""
        restore_the_rest, optimizer = self.backend.restorer(), self.backend.optimizer
        saved = {p: {k: v.clone() for k, v in s.items() if torch.is_tensor(v)} for p, s in optimizer.state.items()}

        def restore() -> None:
            restore_the_rest()
            restore_in_place(optimizer, saved)

        return restore


class GraphedStep:
    """`step` captured on its first call's shapes; each call copies the batch in, replays, returns the loss."""

    def __init__(self, step: Step, images: torch.Tensor, labels: torch.Tensor, restore: Callable[[], None]) -> None:
        device = images.device
        self.images, self.labels = images.clone(), labels.clone()
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(WARMUP_STEPS):
                step(self.images, self.labels)
        torch.cuda.current_stream(device).wait_stream(side)
        restore()  # the warm-up steps' updates undone, in place: the graph keeps the tensors it captured
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, capture_error_mode=CAPTURE_ERROR_MODE):
            self.loss = step(self.images, self.labels)

    def __call__(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        self.images.copy_(images, non_blocking=True)
        self.labels.copy_(labels, non_blocking=True)
        self.graph.replay()
        return self.loss.clone()  # the graph's output is overwritten by the next replay


def why_not_captured(device: torch.device, device_lr: bool, fp32_masters: bool, ranks: int) -> str | None:
    """Why the step cannot be captured here, or None where it can."""
    if device.type != "cuda":
        return f"there is no CUDA graph on {device.type}"
    if not device_lr:
        return "the optimizer reads its lr on the host (optim=sgd takes it on the device with device.foreach=true)"
    if not fp32_masters:
        return "16-bit masters round with a generator the graph does not hold"
    if ranks > 1:
        return "the gradient all-reduce over several ranks is not captured"
    return None


def restore_in_place(optimizer: torch.optim.Optimizer, saved: dict[torch.Tensor, dict[str, torch.Tensor]]) -> None:
    """Every tensor of the optimizer's state back to its `saved` value (zeros where it had none), in place."""
    for param, state in optimizer.state.items():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                before = saved.get(param, {}).get(key)
                if before is None:
                    value.zero_()
                else:
                    value.copy_(before)
