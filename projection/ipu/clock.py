"""The simulated system's clock: what the IPUs would have spent, not what the host took to simulate them."""

from __future__ import annotations

import time
from typing import Any


class DeviceClock:
    """Starts at the wall time it is made (so it follows the host's log lines before it) and then moves only by
    the cost model's time: `step_s` per weight update of `images` and `eval_image_s` per validation image, on
    `system` (as a run's lines name it)."""

    def __init__(self, step_s: float, eval_image_s: float, images: int = 0, system: str = "") -> None:
        self.step_s = step_s
        self.eval_image_s = eval_image_s
        self.images = images
        self.system = system
        self.now_s = self.started_s = time.time()

    @property
    def img_s(self) -> float:
        """The system's training throughput: an update's images over its step."""
        return self.images / self.step_s

    @property
    def elapsed_s(self) -> float:
        """The simulated seconds since the clock started: the run's, as no step runs before run_start."""
        return self.now_s - self.started_s

    def step(self) -> None:
        self.now_s += self.step_s

    def evaluate(self, images: int) -> None:
        self.now_s += images * self.eval_image_s

    def state_dict(self) -> dict[str, Any]:
        return {"now_s": self.now_s, "started_s": self.started_s}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.now_s, self.started_s = state["now_s"], state["started_s"]
