"""What a person watches: a tqdm bar with img/s, loss and lr on a terminal, plain lines elsewhere."""

from __future__ import annotations

import sys

import torch
from tqdm import tqdm

REFRESH_STEPS = 5  # reading the loss is a host sync, so the display refreshes every few steps


class Progress:
    """One bar per epoch (mode "bar"), one line per epoch (mode "lines"), or nothing (mode "none")."""

    def __init__(self, mode: str, max_epochs: int, images_per_step: int) -> None:
        self.mode = ("bar" if sys.stderr.isatty() else "lines") if mode == "auto" else mode
        self.max_epochs = max_epochs
        self.images_per_step = images_per_step
        self._bar: tqdm | None = None

    def start_epoch(self, epoch: int, steps: int, done: int = 0) -> None:
        """An epoch of `steps` steps, `done` of them already taken (a run resumed in its middle)."""
        if self.mode == "bar":
            self._bar = tqdm(
                total=steps * self.images_per_step,
                initial=done * self.images_per_step,
                desc=f"epoch {epoch}/{self.max_epochs}",
                unit="img",
                dynamic_ncols=True,
                leave=False,
            )

    def step(self, step_in_epoch: int, loss: torch.Tensor, lr: float) -> None:
        """Advance the bar; every REFRESH_STEPS steps read the loss (a host sync) and show it."""
        if self._bar is not None and step_in_epoch % REFRESH_STEPS == 0:
            self._bar.set_postfix(loss=f"{float(loss):.3f}", lr=f"{lr:.3g}", refresh=False)
            self._bar.update(step_in_epoch * self.images_per_step - self._bar.n)

    def end_epoch(self, line: str) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self.mode != "none":
            print(line, flush=True)
