"""The MLPerf learning-rate schedule: linear warm-up, then polynomial decay to end_lr."""

from __future__ import annotations

import math
from dataclasses import dataclass

from optim.config import OptimConfig


def learning_rate(
    step: int,
    *,
    base_lr: float,
    warmup_steps: int,
    decay_steps: int,
    end_lr: float = 1e-4,
    power: float = 2.0,
) -> float:
    """Learning rate for the 0-based ``step``; the last warm-up step (warmup_steps - 1) reaches base_lr."""
    if step < 0 or warmup_steps < 0 or decay_steps < 1:
        raise ValueError(
            f"need step >= 0, warmup_steps >= 0, decay_steps >= 1; "
            f"got step={step}, warmup_steps={warmup_steps}, decay_steps={decay_steps}"
        )
    if step < warmup_steps:
        return base_lr * (step + 1) / warmup_steps
    progress = min((step - warmup_steps) / decay_steps, 1.0)
    return float((base_lr - end_lr) * (1.0 - progress) ** power + end_lr)


@dataclass(frozen=True)
class Schedule:
    """``learning_rate`` with its parameters bound: ``Schedule(...)(step) -> lr``."""

    base_lr: float
    warmup_steps: int
    decay_steps: int
    end_lr: float = 1e-4
    power: float = 2.0

    def __call__(self, step: int) -> float:
        return learning_rate(
            step,
            base_lr=self.base_lr,
            warmup_steps=self.warmup_steps,
            decay_steps=self.decay_steps,
            end_lr=self.end_lr,
            power=self.power,
        )

    @classmethod
    def for_run(cls, optim: OptimConfig, max_epochs: int, steps_per_epoch: int) -> Schedule:
        """The configured schedule in steps: decay over optim.decay_epochs, or the epochs after warm-up."""
        decay_epochs = optim.decay_epochs or max_epochs - optim.warmup_epochs
        return cls(
            base_lr=optim.base_lr,
            warmup_steps=steps_from_epochs(optim.warmup_epochs, steps_per_epoch),
            decay_steps=max(1, steps_from_epochs(decay_epochs, steps_per_epoch)),
            end_lr=optim.end_lr,
            power=optim.poly_power,
        )


def steps_from_epochs(epochs: float, steps_per_epoch: int) -> int:
    """Number of steps in ``epochs`` epochs, rounded to the nearest integer (halves up)."""
    return math.floor(epochs * steps_per_epoch + 0.5)
