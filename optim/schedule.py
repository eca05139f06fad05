"""The MLPerf learning-rate schedule: linear warm-up, then polynomial decay to end_lr."""

import math
from dataclasses import dataclass


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


def steps_from_epochs(epochs: float, steps_per_epoch: int) -> int:
    """Number of steps in ``epochs`` epochs, rounded to the nearest integer (halves up)."""
    return math.floor(epochs * steps_per_epoch + 0.5)
