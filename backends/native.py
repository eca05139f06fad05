"""The native backend: PyTorch eager on the CPU or a CUDA device."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from models.loss import smoothed_cross_entropy


class NativeBackend:
    """Forward, label-smoothed loss in fp32, backward over `grad_accum` micro-batches, one optimizer step."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        device: torch.device,
        *,
        label_smoothing: float,
        grad_accum: int = 1,
    ) -> None:
        self.model = model.to(device)
        self.optimizer = optimizer
        self.device = device
        self.label_smoothing = label_smoothing
        self.grad_accum = grad_accum

    def train_step(self, images: torch.Tensor, labels: torch.Tensor, lr: float) -> torch.Tensor:
        self.model.train()
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.zero_grad(set_to_none=True)
        images = images.to(self.device, non_blocking=True)
        labels = labels.to(self.device, non_blocking=True)
        total = torch.zeros((), device=self.device)
        for micro_images, micro_labels in zip(
            images.chunk(self.grad_accum), labels.chunk(self.grad_accum), strict=True
        ):
            logits = self.model(micro_images)
            loss = smoothed_cross_entropy(logits, micro_labels, self.label_smoothing)
            (loss / self.grad_accum).backward()
            total += loss.detach()
        self.optimizer.step()
        return total / self.grad_accum

    @torch.no_grad()
    def eval_step(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        self.model.eval()
        logits = self.model(images.to(self.device, non_blocking=True))
        return (logits.argmax(dim=1) == labels.to(self.device, non_blocking=True)).sum()

    def state_dict(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
