"""device.cuda_graphs: the whole train step (forward, backward, the update) captured once in a CUDA graph, then
replayed each step with the batch copied into the graph's input buffers.

The recipe is PyTorch's "whole network capture" (torch.cuda.graphs docs): a few steps on a side stream first
(cuDNN and the allocator settle, the optimizer's state exists), then the capture, gradients set to None inside
it so that backward allocates them from the graph's pool. A graph freezes every value the host handed a kernel
at capture time, so it is only taken where the step reads nothing from the host and no Python number changes
between steps: the lr and loss scaling's verdict live on the device (LARS, fused SGD), masters are fp32 (16-bit
masters round with a generator of their own) and one rank trains (the gradient all-reduce is not captured).
Elsewhere the step runs eagerly, and the run says why.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Step = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
WARMUP_STEPS = 3
# Only this thread's CUDA calls may not break the capture: the DataLoader's pin-memory thread pins the next batches
# while the step is captured in train.py, which the default ("global") refuses (cudaErrorStreamCaptureInvalidated,
# the GPU check of 2026-11-27); torch.cuda.graph's docs name "thread_local" for such a thread.
CAPTURE_ERROR_MODE = "thread_local"


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
