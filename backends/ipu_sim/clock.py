"""The simulated system's clock: what the IPUs would have spent, not what the host took to simulate them."""

from __future__ import annotations

import time
from typing import Any


class DeviceClock:
    """Starts at the wall time it is made (so it follows the host's log lines before it) and then moves only by
    the cost model's time: `step_s` per weight update and `eval_image_s` per validation image."""

    def __init__(self, step_s: float, eval_image_s: float) -> None:
        self.step_s = step_s
        self.eval_image_s = eval_image_s
        self.now_s = time.time()

    def step(self) -> None:
        self.now_s += self.step_s

    def evaluate(self, images: int) -> None:
        self.now_s += images * self.eval_image_s

    def state_dict(self) -> dict[str, Any]:
        return {"now_s": self.now_s}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.now_s = state["now_s"]
